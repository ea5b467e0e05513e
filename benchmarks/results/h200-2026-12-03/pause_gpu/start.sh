#!/bin/bash
# production's start: the operator's command (eagleflow only runs it); returns once launched
set -e
cd /root/out/r
export VLLM_SERVER_DEV_MODE=1 VLLM_ALLOW_INSECURE_SERIALIZATION=1 PYTHONPATH=/tmp/stubs-eqxt8cm7:/work/main:/root/site:/work/main
setsid /opt/torch/.venv/bin/python3 -m vllm.entrypoints.openai.api_server --host 127.0.0.1 --port 18741 --model /work/main/demo/target \
  --served-model-name target --max-model-len 1024 --gpu-memory-utilization 0.5 --enable-sleep-mode \
  --weight-transfer-config '{"backend": "ipc"}' --disable-uvicorn-access-log \
  --speculative-config '{"method": "eagle3", "model": "/root/out/r/work/production/demo/drafter", "num_speculative_tokens": 3}' \
  >> /root/out/r/production.log 2>&1 < /dev/null &
echo $! > /root/out/r/production.pid
