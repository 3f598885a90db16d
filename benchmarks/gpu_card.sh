# Sourced by the run_*_gpu.sh scripts.
#   card_name          the GPU's short name for a results folder: "NVIDIA H200" -> H200, "NVIDIA H100 80GB HBM3" -> H100
#                      (the first model-number-like word; the whole name, folder-friendly, when there is none)
#   require_gpu SCRIPT_NAME CPU_HINT
#                      stop with exit 2 where no NVIDIA GPU answers, else set `card` to card_name
#   results_dir WHAT   benchmarks/results/<card>/<date>-<WHAT>/, where a run's results go unless told otherwise
#   gpu_engines        every engine available on this GPU, comma-separated, eager first, then compile ($PY runs it)
card_name() {
  local name short
  name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 | sed 's/^NVIDIA //')
  [ -n "$name" ] || return 1
  short=$(echo "$name" | grep -oE '\b[A-Z]+[0-9]+[A-Za-z]*\b' | head -n 1)
  echo "${short:-$(echo "$name" | tr -cs 'A-Za-z0-9' '-' | sed 's/^-*//; s/-*$//')}"
}

require_gpu() {
  if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "$1: no NVIDIA GPU here (nvidia-smi); $2" >&2
    exit 2
  fi
  card=$(card_name)
}

results_dir() {
  echo "benchmarks/results/${card}/$(date -u +%Y-%m-%d)-${1:?results_dir needs a name}"
}

gpu_engines() {
  "${PY:-python3}" - <<'PY'
import torch
from sdaccel.engines import available_engines
names = [n for n, reason in available_engines(torch.device("cuda")).items() if reason is None]
print(",".join(sorted(names, key=lambda n: (n != "eager", n != "compile"))))
PY
}
