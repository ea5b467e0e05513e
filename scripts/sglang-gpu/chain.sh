#!/usr/bin/env bash
# What issue 42 still needs of a GPU host, back to back in one process session of its own, so that no step waits on
# a call from the machine that drives it (a host idle between calls is given back with everything staged on it):
# the side by side on the dense demo target, then on the 5-layer MLA target, then the GPU suite's SGLang cases.
# Each result is copied under $HOME/chain as soon as it exists: a host lost midway keeps what finished before.
#
#   bash scripts/sglang-gpu/chain.sh start DENSE_DRAFTER MLA_DRAFTER [STEPS]   from a copy of the checkout on the
#                                       host, after SGLang's, vLLM's and Prefect's staging (scripts/sglang-gpu/README.md);
#                                       STEPS default "dense mla suite", in that order; "pipeline": every stage
#                                       on SGLang (scripts/gpu_pipeline.py run sgl --engine sglang)
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
    steps=${4:-dense mla suite}
    mkdir -p "$out" && rm -f "$out/done"
    setsid nohup bash "$0" steps "$dense" "$mla" "$steps" >> "$out/chain.log" 2>&1 < /dev/null &
    echo "chain: pid $!, steps: $steps, log $out/chain.log"
    exit 0
fi

[ "$cmd" = steps ] || { echo "chain.sh: unknown command $cmd"; exit 2; }
dense=$2 mla=$3
engines=${GN_HOME:-$HOME/gpu-nightly}/engines
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
    suite)
        (. "$HOME/sgl-site/env.sh" && PYTHONPATH="$HOME/gpu-site:$PWD:${PYTHONPATH:-}" timeout 1500 \
            python3 -m pytest -m gpu tests/gpu/test_sglang_serving.py tests/gpu/test_sglang_capture.py \
            -p no:cacheprovider -v -rsP --durations=0 > "$out/sgl-suite.log" 2>&1)
        echo "exit $?"
        tail -n 15 "$out/sgl-suite.log"
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
