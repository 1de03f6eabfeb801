"""The trainer daemon (`grpo-sentinel serve`)."""

# The API token's variable: serve.py reads it, the supervisor keeps it out of every run's environment,
# the client sends it. Here, below all three, so that none imports another for it.
TOKEN_ENV = "GRPO_SENTINEL_API_TOKEN"
