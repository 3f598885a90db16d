# Sourced by the run_*_gpu.sh scripts: stop with exit 2 where no NVIDIA GPU answers, else set `card` to the GPU's
# name as a folder-friendly slug ("NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3") for results/<card>-<date>/.
#   require_gpu SCRIPT_NAME CPU_HINT
#   gpu_engines        every engine available on this GPU, comma-separated, eager first, then compile ($PY runs it)
#   results_dir [SUB]  benchmarks/results/<card>-<date>[/SUB], where a run's results go unless OUT_DIR says otherwise
require_gpu() {
  if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "$1: no NVIDIA GPU here (nvidia-smi); $2" >&2
    exit 2
  fi
  card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1 | tr '[:upper:]' '[:lower:]' \
         | tr -cs 'a-z0-9' '-' | sed 's/^-*//; s/-*$//')
}

results_dir() {
  echo "benchmarks/results/${card}-$(date -u +%Y-%m-%d)${1:+/$1}"
}

gpu_engines() {
  "${PY:-python3}" - <<'PY'
import torch
from sdaccel.engines import available_engines
names = [n for n, reason in available_engines(torch.device("cuda")).items() if reason is None]
print(",".join(sorted(names, key=lambda n: (n != "eager", n != "compile"))))
PY
}
