#!/usr/bin/env bash
# The check of CUDA device recording on real hardware, in two halves: the binaries are built
# on any machine (no GPU, no CUDA toolkit needed), then travel to a machine with an NVIDIA GPU,
# where nothing is built.
#
#   scripts/gpu_check.sh build   # here: builds into target/gpu-check/ (with CUPTI from PyPI)
#   scripts/gpu_check.sh run     # on the GPU machine, from the repository root: prints figures
#
# `run` prints, in a few minutes at most:
#   - highwater's cuda:0 peak against the sizes the check allocated (must be exact), against the
#     driver's cuMemGetInfo figures, the reserved and context figures, and the rows of the
#     checkpoint a refused allocation wrote (examples/cuda_check.rs);
#   - allocation-heavy steps timed with device recording on against off, in one process;
#   - where `build` found nvcc (PyPI's nvidia-cuda-nvcc wheel ships one), the candle example
#     trained on the GPU (`train_mlp --device cuda`), its summary, and its steps timed with
#     recording on against off (`--ab`).
# Exit status: non-zero when a figure did not match or a step failed.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=target/gpu-check

build() {
  mkdir -p "$BIN/lib"
  cargo build --release --features cuda --example cuda_check
  cargo build --release -p highwater-cli
  cp target/release/examples/cuda_check target/release/highwater "$BIN/"

  # CUPTI is not part of the driver; bring it along in case the GPU machine lacks it.
  if python3 -m pip download --quiet --no-deps --only-binary=:all: \
      -d "$BIN/wheels" nvidia-cuda-cupti-cu12 2>/dev/null; then
    python3 - "$BIN" <<'PY'
import pathlib, sys, zipfile
out = pathlib.Path(sys.argv[1]) / "lib"
for wheel in (pathlib.Path(sys.argv[1]) / "wheels").glob("*.whl"):
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if "/libcupti.so" in name:
                (out / pathlib.Path(name).name).write_bytes(z.read(name))
PY
    ( cd "$BIN/lib" && for lib in libcupti.so.*; do [ -e libcupti.so ] || ln -s "$lib" libcupti.so; done )
    echo "CUPTI from PyPI: $(ls "$BIN/lib")"
  else
    echo "no CUPTI wheel downloaded: the GPU machine's own CUPTI will be used"
  fi

  # The candle example on CUDA needs nvcc to build candle's kernels.
  if command -v nvcc >/dev/null 2>&1; then
    if cargo build --release --example train_mlp --features candle,cuda,candle-core/cuda; then
      cp target/release/examples/train_mlp "$BIN/train_mlp_cuda"
    else
      echo "the candle example did not build with CUDA; the check runs without it"
    fi
  else
    echo "no nvcc here: the candle example on CUDA is left out (pip install nvidia-cuda-nvcc-cu12 to add it)"
  fi
  echo "built: $(ls "$BIN")"
}

run() {
  [ -x "$BIN/cuda_check" ] || { echo "run 'scripts/gpu_check.sh build' first" >&2; exit 2; }
  command -v nvidia-smi >/dev/null 2>&1 && \
    nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader
  # System CUPTI first (it matches the driver); the carried one otherwise.
  for dir in /usr/local/cuda/extras/CUPTI/lib64 /usr/local/cuda/lib64; do
    [ -d "$dir" ] && export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  done
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$PWD/$BIN/lib"
  work=$(mktemp -d)
  status=0

  echo "== known buffers, the driver's view, a refusal"
  "$BIN/cuda_check" --out "$work/cuda.json" --ab || status=$?
  "$BIN/highwater" summary "$work/cuda.json" || status=$?

  if [ -x "$BIN/train_mlp_cuda" ]; then
    echo "== candle train_mlp --device cuda"
    "$BIN/train_mlp_cuda" --device cuda --steps 100 --out "$work/mlp.json" || status=$?
    "$BIN/highwater" top "$work/mlp.json" -n 8 || status=$?
    echo "== candle steps, recording on against off"
    "$BIN/train_mlp_cuda" --device cuda --ab --steps 400 || status=$?
  fi
  echo "profiles in $work"
  exit "$status"
}

case "${1:-}" in
  build) build ;;
  run) run ;;
  *) echo "usage: $0 build|run" >&2; exit 2 ;;
esac
