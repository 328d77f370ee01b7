#!/usr/bin/env bash
# Prove the GPU paths on ONE GPU in under 10 minutes, with the embedded tiny target in bf16:
# NVML preflight, hidden-state extraction through vLLM (CUDA build, upstream connector),
# draft training (CUDA bf16), validation in vLLM with its spec-decode counters.
#
#   scripts/gpu_smoke.sh [hardware=h200_x1] [more overrides...]
#
# Needs the two environments already installed (a GPU machine here has no network):
# .venv with `pip install -e .` and .venv-vllm with `eagle3-vllm-env install --device cuda`.
# Runs in a temporary working directory (never the pipeline's own outputs) and prints each
# stage's metrics; exits non-zero at the first failing stage.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d -t eagle3-gpu.XXXXXX)"
cp -r "$repo/conf" "$work/conf"
cd "$work"
export EAGLE3_VLLM_PYTHON="${EAGLE3_VLLM_PYTHON:-$repo/.venv-vllm/bin/python}"
args=(hardware=h200_x1 model.dtype=bfloat16 extract.backend=vllm extract.dtype=bfloat16
      target.train_steps=200 train.epochs=5 validate.vllm=true "$@")
nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv || true
for stage in preflight target prepare extract train validate; do
  echo "== $stage ${args[*]}"
  start=$(date +%s)
  python -m "eagle3_pipeline.stages.$stage" "${args[@]}"
  echo "== $stage done in $(( $(date +%s) - start )) s"
  cat "metrics/details/$stage.json" | head -c 2000; echo
done
echo "== work dir: $work"
