#!/usr/bin/env bash
# Kimi's nightly on a GPU host, as the product runs it (scripts/gpu_nightly.py says what each step does). Staged
# like the GPU suite (scripts/gpu_suite.sh): the host has Python 3.12 and torch, no network; vLLM is a directory of
# its GPU wheel and what it needs ($VLLM_SITE, default $HOME/site), here with its fused-MoE kernels, which an MoE
# target needs. From the project root:
#
#   bash scripts/gpu_nightly.sh stage       on a machine with network: Prefect's wheels for Python 3.12 (the control
#                                           environment) into .stage-nightly/wheels, and vLLM's MoE kernel library
#                                           (xz) into .stage-nightly/moe.so.xz (ignored by git; under 64 MiB each)
#   bash scripts/gpu_nightly.sh install     on the GPU host: the wheels into $GN_HOME/control (the control
#                                           environment, apart from vLLM's: their fastapi pins clash), the MoE kernel
#                                           into $VLLM_SITE/vllm
#   python3 scripts/gpu_nightly.py up       then `night 1`, `night 2`, `night 3 --plant`, `table`, `down`
#
# Record the table (python3 scripts/gpu_nightly.py table) in docs/benchmarks.md, "The nightly on a GPU host".
set -euo pipefail
gn=${GN_HOME:-$HOME/gpu-nightly}
site=${VLLM_SITE:-$HOME/site}
case "${1:-}" in
stage)
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    plat="--only-binary=:all: --python-version 3.12 --implementation cp"
    for n in 17 24 26 27 28 31 34 35; do plat="$plat --platform manylinux_2_${n}_x86_64"; done
    plat="$plat --platform manylinux2014_x86_64 --platform any"
    rm -rf .stage-nightly && mkdir -p .stage-nightly/wheels
    # pyarrow: the host has it already (and it is 53 MB)
    PIP_CONSTRAINT= python3 -m pip download -q $plat -d "$work/dl" prefect==3.9.1 pyyaml pydantic httpx
    cp "$work"/dl/*.whl .stage-nightly/wheels/
    PIP_CONSTRAINT= python3 -m pip download -q --no-deps $plat -d "$work/v" vllm==0.26.0
    (cd "$work" && unzip -q v/vllm-*.whl 'vllm/_moe_C_stable_libtorch.abi3.so')
    xz -6 -T2 -c "$work/vllm/_moe_C_stable_libtorch.abi3.so" > .stage-nightly/moe.so.xz
    du -sh .stage-nightly/*
    ;;
install)
    [ -d "$site/vllm" ] || { echo "no vLLM in $site: stage it first (scripts/gpu_suite.sh's header says how)"; exit 1; }
    mkdir -p "$gn"
    if [ -d .stage-nightly/wheels ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --target "$gn/control" .stage-nightly/wheels/*.whl
        echo "control environment: $(ls "$gn/control" | wc -l) entries in $gn/control"
    fi
    if [ -f .stage-nightly/moe.so.xz ]; then
        # Written aside, then renamed: a process that waits for the kernel (scripts/sglang-gpu/chain.sh) never
        # sees half of it.
        moe="$site/vllm/_moe_C_stable_libtorch.abi3.so"
        python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
            .stage-nightly/moe.so.xz "$moe.part"
        mv "$moe.part" "$moe"
        echo "vLLM's MoE kernels in $site/vllm"
    fi
    ;;
*)
    sed -n 2,16p "$0"
    exit 2
    ;;
esac
