#!/usr/bin/env bash
# sdaccel's two entry points, each doing its own set-up on a fresh machine:
#   ./run.sh bench   install, then benchmark the default model (synthetic SD1.5 on a GPU, a tiny model on CPU)
#   ./run.sh test    install (with test extras), then run the test suite
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1

has_gpu() {
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1
}

setup() {
  # torch first, chosen by hand: a bare `torch` requirement would pull a multi-GB CUDA build onto a CPU machine.
  if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    if has_gpu; then
      "$PY" -m pip install -q torch
    else
      "$PY" -m pip install -q torch==2.13.0
    fi
  fi
  "$PY" -m pip install -q -e ".[$1]"
}

case "${1:-}" in
  bench)
    setup plots,onnx
    shift
    if "$PY" -m sdaccel bench --help >/dev/null 2>&1; then
      exec "$PY" -m sdaccel bench "$@"
    fi
    exec "$PY" -m sdaccel generate "an astronaut riding a horse on mars" "$@"
    ;;
  test)
    setup dev
    shift
    # Without a GPU most of the suite runs Triton kernels in its interpreter, one core per process: two worker
    # processes (pytest-xdist) take a 2-core CI machine from 21 to 13 minutes. With a GPU the GPU tests share one
    # card, so they run in one process. SDACCEL_TEST_WORKERS overrides the count (0: no workers).
    workers=()
    if ! has_gpu; then
      workers=(-n "${SDACCEL_TEST_WORKERS:-2}")
    elif [ -n "${SDACCEL_TEST_WORKERS:-}" ]; then
      workers=(-n "$SDACCEL_TEST_WORKERS")
    fi
    exec "$PY" -m pytest -q ${workers[@]+"${workers[@]}"} "$@"
    ;;
  *)
    echo "usage: ./run.sh bench [sdaccel bench options] | ./run.sh test [pytest options]" >&2
    exit 2
    ;;
esac
