#!/usr/bin/env bash
# The wheels benchmarks/bench_gpu.py needs on this project's GPU machine (Python 3.12, torch 2.11,
# transformers 5.17, peft and pyarrow/pandas already there; no network): what our step imports and the
# image lacks (pydantic; peft at our tested version), and TRL with what it imports beyond the image
# (datasets, dill, multiprocess; datasets wants pyarrow >= 24: if the image's is older, TRL's line fails and
# the others still run). Into .whl/ (git-ignored), to be carried; bench_gpu.py's docstring has
# the command that installs them there.
set -euo pipefail
cd "$(dirname "$0")/.."
py=(--python-version 3.12 --implementation cp --only-binary=:all: --platform manylinux_2_28_x86_64
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
python3 -m pip download -q --no-deps "${py[@]}" -d .whl \
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0 \
  peft==0.21.2 trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
du -sh .whl
