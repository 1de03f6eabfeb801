"""Telemetry attached to trainers that are not ours (installed as `grpo_sentinel.integrations`)."""
