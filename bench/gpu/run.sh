#!/usr/bin/env bash
# mpdoctor's GPU kit: every face on a CUDA machine, and the instrumentation's cost there.
#
#   bash bench/gpu/run.sh OUTDIR                        # on the GPU machine (< 8 min, no network)
#   bash bench/gpu/run.sh OUTDIR --device cpu --small   # the CPU dry run (tests/test_gpu_kit.py)
#   PYTHON=/path/to/python bash bench/gpu/run.sh OUTDIR # the interpreter that has torch
#
# Everything lands in OUTDIR (summary.md: the tables). Options: python bench/gpu/kit.py --help
set -u
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${PYTHON:-$(command -v python || command -v python3)}"
if [ -z "$PY" ]; then
  echo "bench/gpu/run.sh: no python on PATH (set PYTHON=...)" >&2
  exit 2
fi
if [ $# -lt 1 ]; then
  echo "usage: bash bench/gpu/run.sh OUTDIR [--device auto|cuda|cpu] [--small] [--install auto|pip|system|pythonpath]" >&2
  exit 2
fi
exec "$PY" "$HERE/kit.py" --python "$PY" "$@"
