#!/usr/bin/env bash
# The GPU proof: the whole pipeline on ONE GPU in under 10 minutes with the embedded tiny
# target in bf16 -- NVML preflight, target, prepare, hidden-state extraction (hf backend)
# on CUDA, draft training on CUDA in bf16, GPU memory released once the training workers
# exited, our acceptance evaluator on CUDA (validate.vllm=false: no vLLM, no DVC) -- each
# asserted from the stages' own records; exits 1 naming the first failure in one line,
# prints each stage's time and the total (scripts/gpu_proof.py does the work).
#
#   scripts/gpu_proof.sh [hardware=h200_x1] [--workdir DIR] [--verbose] [more overrides...]
#   scripts/gpu_proof.sh hardware=cpu       # the dry check on a machine without a GPU
#
# On the lent GPU machine (Python 3.12 with torch and transformers, no network), with the
# wheels of scripts/gpu_wheels.py carried in .whl/ (README: "GPU checks"):
#
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#     --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD/src && scripts/gpu_proof.sh
#
# The package runs from this checkout's src/ (PYTHONPATH), never an installed copy.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
exec "${PYTHON:-python3}" "$repo/scripts/gpu_proof.py" "$@"
