#!/bin/bash
# production's start: the operator's command (eagleflow only runs it); returns once launched
set -e
cd <gpu host work dir>/out/r
export VLLM_SERVER_DEV_MODE=1 VLLM_ALLOW_INSECURE_SERIALIZATION=1 PYTHONPATH=<scratch dir>/stubs-eqxt8cm7:<repository root>:<gpu host work dir>/site:<repository root>
setsid <gpu host venv>/bin/python3 -m vllm.entrypoints.openai.api_server --host 127.0.0.1 --port 18741 --model demo/target \
  --served-model-name target --max-model-len 1024 --gpu-memory-utilization 0.5 --enable-sleep-mode \
  --weight-transfer-config '{"backend": "ipc"}' --disable-uvicorn-access-log \
  --speculative-config '{"method": "eagle3", "model": "<work root>/production/demo/drafter", "num_speculative_tokens": 3}' \
  >> <gpu host work dir>/out/r/production.log 2>&1 < /dev/null &
echo $! > <gpu host work dir>/out/r/production.pid
