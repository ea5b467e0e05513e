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
# vLLM: tests/gpu/test_swap_probe.py drives a real vLLM production (sleep, a drafter swapped in, the probe) and is
# skipped where vLLM is not importable. A GPU host with no network has it as a directory of vLLM's GPU wheel and
# the wheels it needs, installed with `pip install --no-deps --target DIR` (vLLM 0.26.0 for torch 2.11): name it
# in VLLM_SITE (default $HOME/site, used when it holds vllm/); `run` puts it on PYTHONPATH after the project and
# sets what vLLM needs there (no flashinfer sampler, no usage stats, no hub). That test also wants the trained demo
# drafter in the copy (runs/demo/export/*/vllm, made by `make demo`), and is skipped without it.
#
# SGLang: tests/gpu/test_sglang_serving.py serves the demo target behind eagleflow drafters through eagleflow's
# SGLang adapter, tests/gpu/test_sglang_capture.py captures from it through eagleflow's SGLang plugin; both skipped
# in the vLLM run (SGLang not importable there) and run again, alone, with SGLang's staged site (scripts/sglang-gpu/:
# $SGL_SITE, default $HOME/sgl-site, and its env.sh) when it is there.
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
    path="$site:$PWD"
    vllm_site=${VLLM_SITE:-$HOME/site}
    if [ -d "$vllm_site/vllm" ]; then
        path="$path:$vllm_site"
        export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1
    fi
    set +e
    PYTHONPATH="$path" python3 -m pytest -m gpu tests/gpu -p no:cacheprovider -q -rs -s 2>&1 | tee "$out"
    rc=${PIPESTATUS[0]}
    sgl_site=${SGL_SITE:-$HOME/sgl-site}
    if [ -f "$sgl_site/env.sh" ]; then
        # SGLang's cases again with SGLang's own site and compiler, not beside vLLM's (their pins differ)
        (. "$sgl_site/env.sh" && PYTHONPATH="$site:$PWD:$PYTHONPATH" python3 -m pytest -m gpu \
            tests/gpu/test_sglang_serving.py tests/gpu/test_sglang_capture.py -p no:cacheprovider -v -rs \
            --durations=0) 2>&1 \
            | tee -a "$out"
        src=${PIPESTATUS[0]}
        [ "$rc" = 0 ] && rc=$src
    fi
    set -e
    gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | tr -s ' ' | paste -sd ',')
    vllm=$(PYTHONPATH="$path" python3 -c 'import importlib.metadata as m; print(m.version("vllm"))' 2>/dev/null || echo none)
    echo "gpu suite: $(date -u +%Y-%m-%dT%H:%MZ), commit $commit, $gpus, torch $(python3 -c 'import torch; print(torch.__version__)'), vllm $vllm, exit $rc" | tee -a "$out"
    exit "$rc"
    ;;
*)
    sed -n 2,23p "$0"
    exit 2
    ;;
esac
