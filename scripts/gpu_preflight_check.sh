#!/usr/bin/env bash
# Run the preflight stage on a real GPU machine and show what it recorded.
#
#   scripts/gpu_preflight_check.sh [hardware=PROFILE] [more overrides...]
#   e.g. scripts/gpu_preflight_check.sh hardware=h200_x1
#        CUDA_VISIBLE_DEVICES=0,1 scripts/gpu_preflight_check.sh hardware=rtx_pro_6000_x8 hardware.gpu_count=2
#
# Runs from the repository root, writes into a temporary data/metrics directory (never the
# pipeline's own outputs), prints nvidia-smi's view next to preflight's, and exits with
# preflight's status. preflight.strict=false is not set: a failed check shows as exit 1.
set -uo pipefail
cd "$(dirname "$0")/.."
out="$(mktemp -d -t eagle3-preflight.XXXXXX)"
echo "== nvidia-smi"
nvidia-smi --query-gpu=index,name,uuid,memory.total,memory.used,compute_cap,mig.mode.current \
  --format=csv 2>&1 || echo "(nvidia-smi not available)"
nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv 2>/dev/null || true
echo "== CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-<unset>} CUDA_DEVICE_ORDER=${CUDA_DEVICE_ORDER-<unset>}"
echo "== preflight $*"
start=$(date +%s.%N)
python -m eagle3_pipeline.stages.preflight "data_dir=$out/data" "metrics_dir=$out/metrics" "$@"
rc=$?
end=$(date +%s.%N)
echo "== exit $rc, $(python -c "print(f'{$end - $start:.1f}')") s"
echo "== $out/data/preflight/inventory.json"
cat "$out/data/preflight/inventory.json" 2>/dev/null
echo "== $out/metrics/details/preflight.json (passed, mode, driver, gpus)"
python - "$out/metrics/details/preflight.json" <<'PY' 2>/dev/null
import json, sys
m = json.load(open(sys.argv[1]))
print({k: m[k] for k in ("passed", "mode", "driver_version", "cuda_driver_version", "torch")})
for g in m["gpus"]:
    print(g["cuda_index"], g["index"], g["name"], g["memory_used_mib"], "/", g["memory_total_mib"],
          "MiB cc", g["compute_capability"], "mig", g["mig_enabled"], g["processes"])
PY
exit $rc
