#!/usr/bin/env bash
# SGLang's staging checked on the GPU host (after unpack.sh): the bundle's imports and compiler, then a target
# behind an EAGLE-3 drafter as eagleflow exports it, served for a few requests: does SGLang load the drafter, does it
# answer, what it reports (its server info's acceptance, its speculative metrics, the log's "accept len" lines).
# From the project root:
#
#   .hostenv/bin/python tests/make_drafter.py DRAFTER --sglang here: an untrained drafter in the layout SGLang serves
#   bash scripts/sglang-gpu/smoke.sh DRAFTER [TARGET] [SECONDS] on the GPU host: at most SECONDS (default 240) to health
# CUDA graphs off (eagleflow's launch with engine.enforce_eager): their capture compiles for minutes on a first start.
set -uo pipefail
drafter=${1:?usage: smoke.sh DRAFTER [TARGET] [SECONDS]}
target=${2:-demo/target}
limit=${3:-240}
. "$HOME/sgl-site/env.sh"
python3 -c "import sglang, torch, transformers; print('sglang', sglang.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
command -v g++ || echo "no g++ on this host"
log=$HOME/sglang-smoke.log
t0=$SECONDS
setsid nohup python3 -m sglang.launch_server --model-path "$target" --attention-backend triton \
    --sampling-backend pytorch --disable-decode-cuda-graph --disable-prefill-cuda-graph \
    --speculative-algorithm EAGLE3 --speculative-draft-model-path "$drafter" \
    --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 --enable-metrics \
    --port 30000 --mem-fraction-static 0.3 --context-length 1024 > "$log" 2>&1 < /dev/null &
pid=$!
python3 - "$limit" "$pid" <<'PY'
import json, os, sys, time, urllib.request
limit, pid = float(sys.argv[1]), int(sys.argv[2])
t0 = time.monotonic()
def get(path, data=None):
    req = urllib.request.Request("http://127.0.0.1:30000" + path, data=json.dumps(data).encode() if data else None,
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status, r.read().decode()
while time.monotonic() - t0 < limit:
    try:
        if get("/health")[0] == 200:
            break
    except Exception:
        pass
    try:
        os.kill(pid, 0)
    except OSError:
        print("server exited"); sys.exit(0)
    time.sleep(2)
else:
    print(f"not healthy within {limit} s"); sys.exit(0)
print(f"healthy after {time.monotonic() - t0:.1f} s")
for t in (0.0, 1.0):
    s, body = get("/v1/chat/completions", {"model": "x", "messages": [{"role": "user", "content": "Tell me a story."}],
                                          "max_tokens": 64, "temperature": t, "top_p": 0.95})
    print("chat", t, s, body[:400])
for path in ("/get_server_info", "/server_info"):
    try:
        s, body = get(path)
        info = json.loads(body)
        print(path, s, json.dumps(info.get("internal_states"))[:600])
    except Exception as e:
        print(path, "->", e)
s, body = get("/metrics")
print("\n".join(l for l in body.splitlines() if not l.startswith("#") and ("spec" in l or "accept" in l))[:1500])
print("metric names:", sorted({l.split("{")[0].split(" ")[0] for l in body.splitlines() if l.startswith("sglang:")})[:60])
PY
echo "== log after $((SECONDS - t0)) s"
grep -i "accept len\|error\|exception\|Traceback" "$log" | tail -15
tail -25 "$log"
kill -- -"$pid" 2>/dev/null
