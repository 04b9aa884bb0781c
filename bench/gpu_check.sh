#!/usr/bin/env bash
# bench/gpu_check.py on the GPU machine (see its docstring), from the repository root:
#
#     bash bench/gpu_check.sh [gpu_check.py options]
#
# Installs the carried wheels (.whl/: traitlets, tornado, jupyter_server, ipywidgets, ...) into
# $SITE (pip, else plain unzipping), puts them first on PYTHONPATH, saves nvidia-smi's view,
# and runs the check with a hard limit, its output also in $OUT/gpu_check.log.
set -u -o pipefail
PYTHON=${PYTHON:-python3}
SITE=${SITE:-/tmp/site}
OUT=${OUT:-gpu-check-out}
mkdir -p "$OUT"
$PYTHON -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .whl/*.whl ||
    $PYTHON -c "import glob, sys, zipfile
for wheel in glob.glob('.whl/*.whl'):
    zipfile.ZipFile(wheel).extractall(sys.argv[1])" "$SITE"
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
PYTHONUNBUFFERED=1 timeout -s INT -k 15 "${LIMIT:-400}" $PYTHON bench/gpu_check.py --out "$OUT" "$@" 2>&1 |
    tee "$OUT/gpu_check.log"
