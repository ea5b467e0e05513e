#!/usr/bin/env bash
# The GPU suite (tests/gpu, `pytest -m gpu`) on a GPU host whose Python (3.12) has torch, transformers and
# safetensors but no pytest, no pydantic and no network. Two steps, from the project root:
#
#   bash scripts/gpu_suite.sh stage          on a machine with network: pytest's and pydantic's wheels for
#                                            Python 3.12 into .stage-gpu/ (ignored by git)
#   bash scripts/gpu_suite.sh run COMMIT     on the GPU host, in a copy of the checkout with .stage-gpu in it:
#                                            installs them under $HOME, runs the suite, writes $OUT/gpu-suite.txt
#                                            ($OUT: a directory of results to bring back, else the checkout)
#
# Record the result (date, commit, counts) in docs/benchmarks.md, "The GPU suite".
set -euo pipefail
case "${1:-}" in
stage)
    rm -rf .stage-gpu && mkdir -p .stage-gpu
    PIP_CONSTRAINT= python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform any -d .stage-gpu \
        pytest pydantic
    ls .stage-gpu
    ;;
run)
    commit=${2:?the commit under test}
    site=$HOME/gpu-site
    python3 -m pip install -q --no-index --no-deps --target "$site" .stage-gpu/*.whl
    out=${OUT:-.}/gpu-suite.txt
    set +e
    PYTHONPATH="$site:$PWD" python3 -m pytest -m gpu tests/gpu -p no:cacheprovider -q -rs -s 2>&1 | tee "$out"
    rc=${PIPESTATUS[0]}
    set -e
    gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | tr -s ' ' | paste -sd ',')
    echo "gpu suite: $(date -u +%Y-%m-%dT%H:%MZ), commit $commit, $gpus, torch $(python3 -c 'import torch; print(torch.__version__)'), exit $rc" | tee -a "$out"
    exit "$rc"
    ;;
*)
    sed -n 2,11p "$0"
    exit 2
    ;;
esac
