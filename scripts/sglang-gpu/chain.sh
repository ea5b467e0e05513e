#!/usr/bin/env bash
# What issue 42 still needs of a GPU host, back to back in one process session of its own, so that no step waits on
# a call from the machine that drives it (a host idle between calls is given back with everything staged on it):
# the GPU suite's SGLang capture cases while vLLM is still being staged, the side by side on the dense demo target,
# the SGLang serving cases, the side by side on the 5-layer MLA target.
# Each result is copied under $HOME/chain as soon as it exists: a host lost midway keeps what finished before.
#
#   bash scripts/sglang-gpu/chain.sh start DENSE_DRAFTER MLA_DRAFTER [STEPS]   from a copy of the checkout on the
#                                       host, once SGLang is staged (scripts/sglang-gpu/README.md); STEPS default
#                                       "capture vllm dense serving mla", in that order: "capture" and "serving" are
#                                       the GPU suite's two SGLang files ("suite" both), "vllm" waits (15 min at
#                                       most) for vLLM's staging, its MoE kernel and Prefect's wheels, to finish;
#                                       "pipeline": every stage on SGLang (scripts/gpu_pipeline.py run sgl
#                                       --engine sglang)
#   bash scripts/sglang-gpu/chain.sh wait [SECONDS]                             follow it: exit 75 while it runs
#
# The MLA target must travel with the checkout (demo/target-mla5: scripts/build_demo_mla_target.py --layers 5).
set -uo pipefail
out=$HOME/chain
cmd=${1:?usage: chain.sh start DENSE_DRAFTER MLA_DRAFTER [STEPS] | wait [SECONDS]}

if [ "$cmd" = wait ]; then
    limit=${2:-540}
    for _ in $(seq 1 $((limit / 5))); do
        [ -f "$out/done" ] && { tail -n 40 "$out/chain.log"; exit 0; }
        sleep 5
    done
    tail -n 12 "$out/chain.log"
    exit 75
fi

if [ "$cmd" = start ]; then
    dense=$(realpath "${2:?the dense drafter}") mla=$(realpath "${3:?the MLA drafter}")
    steps=${4:-capture vllm dense serving mla}
    mkdir -p "$out" && rm -f "$out/done"
    setsid nohup bash "$0" steps "$dense" "$mla" "$steps" >> "$out/chain.log" 2>&1 < /dev/null &
    echo "chain: pid $!, steps: $steps, log $out/chain.log"
    exit 0
fi

[ "$cmd" = steps ] || { echo "chain.sh: unknown command $cmd"; exit 2; }
dense=$2 mla=$3
engines=${GN_HOME:-$HOME/gpu-nightly}/engines
suite() {  # the GPU suite's SGLang files given, with SGLang's site and env.sh; $1 names the log
    local log=$out/$1.log
    shift
    (. "$HOME/sgl-site/env.sh" && PYTHONPATH="$HOME/gpu-site:$PWD:${PYTHONPATH:-}" timeout 1500 \
        python3 -m pytest -m gpu "$@" -p no:cacheprovider -v -rsP --durations=0 > "$log" 2>&1)
    echo "exit $?"
    tail -n 15 "$log"
}
# What every SGLang start imports once the bundle holds it (DeepGEMM loads its compiled library at import): a
# failure here is every SGLang step's, in seconds instead of after a vLLM run.
(. "$HOME/sgl-site/env.sh" && python3 -c 'import torch, deep_gemm, cutlass; print("sglang imports: deep_gemm, cutlass ok")') ||
    echo "sglang imports FAILED: every SGLang launch would stop at start (see above)"
for step in $4; do
    echo "== $(date -u +%H:%M:%S) $step"
    case $step in
    dense)
        python3 scripts/gpu_engines.py steps --drafter "$dense"
        echo "exit $?"
        cp "$engines/engines.json" "$out/engines-dense.json"
        ;;
    mla)
        python3 scripts/gpu_engines.py steps --config configs/demo-mla.yaml --drafter "$mla" \
            --set target.model_path="$PWD/demo/target-mla5" --set 'target.aux_layer_ids=[2,3,4]' \
            --set target.final_layer_id=5
        echo "exit $?"
        cp "$engines/engines.json" "$out/engines-mla.json"
        ;;
    suite) suite sgl-suite tests/gpu/test_sglang_serving.py tests/gpu/test_sglang_capture.py ;;
    capture) suite sgl-capture tests/gpu/test_sglang_capture.py ;;
    serving) suite sgl-serving tests/gpu/test_sglang_serving.py ;;
    vllm)  # the last of vLLM's staging: its MoE kernel (renamed into place whole) and Prefect's wheels
        moe=${VLLM_SITE:-$HOME/site}/vllm/_moe_C_stable_libtorch.abi3.so
        for _ in $(seq 1 180); do
            [ -f "$moe" ] && [ -d "${GN_HOME:-$HOME/gpu-nightly}/control/prefect" ] && break
            sleep 5
        done
        [ -f "$moe" ] && echo "vLLM staged" || echo "vLLM's staging did not finish in 15 min: its steps will fail"
        ;;
    pipeline)  # every stage on SGLang (generate, its own capture, train, export, benchmark) on the dense target
        python3 scripts/gpu_pipeline.py run sgl --engine sglang --config configs/demo.yaml \
            --set 'benchmark.temperatures=[0.0, 1.0]' --set 'benchmark.concurrencies=[1, 8]' --set benchmark.top_p=0.95
        rc=75
        while [ "$rc" = 75 ]; do
            python3 scripts/gpu_pipeline.py wait sgl --timeout 540 > "$out/pipeline-sgl.log" 2>&1
            rc=$?
        done
        echo "exit $rc"
        tail -n 40 "$out/pipeline-sgl.log"
        ;;
    *) echo "unknown step $step" ;;
    esac
done
echo "== $(date -u +%H:%M:%S) done"
touch "$out/done"
