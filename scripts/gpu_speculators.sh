#!/usr/bin/env bash
# vLLM's `speculators` 0.9.0 on a GPU host without network, for scripts/gpu_speculators.py (eagleflow's drafter
# against speculators' on the states a pipeline run extracted there). The host has Python 3.12, torch, transformers,
# safetensors, numpy, pyarrow and httpx; this stages the rest. From the project root:
#
#   bash scripts/gpu_speculators.sh stage     on a machine with network: speculators' wheel and those of its
#                                             dependencies the host lacks, for CPython 3.12 manylinux x86_64, into
#                                             .stage-spec/wheels (ignored by git; about 30 MiB), then checks that
#                                             every requirement of the set is staged or the host's
#   bash scripts/gpu_speculators.sh install   on the GPU host: the wheels into $GN_HOME/specsite (pip --target, no
#                                             dependencies), then checks there that speculators imports beside the
#                                             host's own torch and transformers, and that every requirement of the
#                                             staged set is met by what that interpreter sees
#
# torchvision and torchaudio (speculators' requirements) are left out on purpose: PyPI's builds break imports beside
# another torch, and speculators' training does not use them (the CPU comparison's .specenv removes them too).
set -euo pipefail
gn=${GN_HOME:-$HOME/gpu-nightly}
# Resolved for speculators 0.9.0 beside transformers 5.17.0 (the host's), less what the host has (scripts/
# gpu_speculators.py HOST_HAS). Pinned, so a stage made later carries the same set; the check after the download says
# when a pin no longer covers a requirement. huggingface-hub, fsspec and typing-extensions are here although the host
# has them: datasets 5.1 needs huggingface-hub>=1.31 and fsspec<=2026.7.0, pydantic 2.14 typing-extensions>=4.16.
wheels=(
    speculators==0.9.0 hs-connectors==0.9.0
    datasets==5.1.0 dill==0.4.1 multiprocess==0.70.19 xxhash==4.1.0 pandas==3.1.1 python-dateutil==4.0.0
    tzdata==2026.6 fsspec==2026.7.0 huggingface-hub==1.33.0 hf-xet==1.8.0 tqdm==4.70.1
    aiohttp==3.14.5 aiohappyeyeballs==2.7.1 aiosignal==1.4.0 attrs==26.1.0 frozenlist==1.8.0 multidict==7.2.1
    propcache==0.5.4 yarl==1.25.1 idna==3.21
    openai==3.63.0 httpx2==2.17.0 httpcore2==2.17.0 h11==0.16.0 truststore==0.10.5 anyio==4.16.0 sniffio==1.3.1
    jiter==0.19.0
    pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0
    pydantic-settings==2.16.3 python-dotenv==1.2.4
    rich==15.0.0 markdown-it-py==4.3.0 mdurl==0.1.2 pygments==2.21.0 typer==0.29.2 shellingham==1.5.4
    annotated-doc==0.0.7 click==8.5.1 loguru==0.7.3 protobuf==7.36.2 psutil==7.2.2
)
case "${1:-}" in
stage)
    plat="--only-binary=:all: --python-version 3.12 --implementation cp"
    for n in 17 24 26 27 28 31 34 35; do plat="$plat --platform manylinux_2_${n}_x86_64"; done
    plat="$plat --platform manylinux2014_x86_64 --platform any"
    rm -rf .stage-spec && mkdir -p .stage-spec/wheels
    # --no-deps: the set above is the whole closure; resolving again would fetch torch (hundreds of MB) to drop it
    PIP_CONSTRAINT= python3 -m pip download -q --no-deps $plat -d .stage-spec/wheels "${wheels[@]}"
    python3 scripts/gpu_speculators.py wheels .stage-spec/wheels
    echo "$(ls .stage-spec/wheels | wc -l) wheels, $(du -sm .stage-spec | cut -f1) MiB in .stage-spec"
    ;;
install)
    [ -d .stage-spec/wheels ] || { echo "no .stage-spec/wheels here: run 'bash $0 stage' where there is network"; exit 1; }
    # a fresh directory: --target over an older install would leave the older files beside the new ones
    rm -rf "$gn/specsite"
    mkdir -p "$gn"
    python3 -m pip install -q --no-index --no-deps --target "$gn/specsite" .stage-spec/wheels/*.whl
    echo "speculators' site: $(ls "$gn/specsite" | wc -l) entries in $gn/specsite"
    PYTHONPATH="$gn/specsite" python3 scripts/gpu_speculators.py site
    ;;
*)
    sed -n 2,16p "$0"
    exit 2
    ;;
esac
