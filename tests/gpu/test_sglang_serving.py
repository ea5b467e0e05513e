"""SGLang on a GPU through eagleflow's own adapter (issue 42): the demo target behind an EAGLE-3 drafter in the layout
SGLang serves as trained (tests/make_drafter.py's `sglang`), launched by `SglangServer` from the config's engine
section as the benchmark stage launches it, greedy and sampled requests answered, and the window's acceptance read
from SGLang's own counters; then sampled drafts (`benchmark.draft_sample_method: probabilistic`) over a drafter of
the whole vocabulary, SGLang's rejection sampling, served the same way.

Skipped where torch sees no CUDA device or SGLang is not importable (scripts/gpu_suite.sh runs this file a second
time with SGLang's staged site, scripts/sglang-gpu/, apart from vLLM's).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from eagleflow.engines.sglang import acceptance_from_answers
from tests.gpu.sglang_demo import sglang_sets

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device"),
    pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="SGLang is not importable"),
]
ROOT = Path(__file__).resolve().parents[2]


def served(tmp_path: Path, drafter: Path, sample_method: str | None) -> tuple[dict, dict]:
    """The demo target behind `drafter` on SGLang, four chats at temperature 0 and four at 1.0 / 0.95: the window's
    acceptance from SGLang's counters, and from its answers as the benchmark reads it (each one's meta_info)."""
    from eagleflow.config import load_config
    from eagleflow.engines import make_server
    from eagleflow.engines.launch import speculative, target_launch
    from eagleflow.util.http import client

    cfg = load_config(ROOT / "configs" / "demo.yaml", sglang_sets(tmp_path))
    launch = target_launch(cfg, speculative(str(drafter), 3, draft_sample_method=sample_method))
    with make_server(launch, tmp_path / f"engine-{sample_method or 'greedy'}.log", name="sglang") as server:
        before = server.snapshot()
        bodies = []
        for i, (t, p) in enumerate([(0.0, 1.0)] * 4 + [(1.0, 0.95)] * 4):
            body = {
                "model": cfg.target.served_model_name,
                "messages": [{"role": "user", "content": f"Tell me a story about the number {i}."}],
                "max_tokens": 64,
                "temperature": t,
                "top_p": p,
                "seed": i,
                **server.request_extra,
            }
            r = client().post(f"{server.base_url}/v1/chat/completions", json=body, timeout=120.0)
            assert r.status_code == 200, r.text[:500]
            assert r.json()["usage"]["completion_tokens"] > 0
            bodies.append(r.json())
        after = server.snapshot()
        counted = server.acceptance(before, after, 3)
    answered = acceptance_from_answers(bodies, 3)
    assert answered is not None, bodies[0]  # each answer carries its verify steps and accepted-drafts histogram
    pos = answered["per_position_acceptance"]
    # the two readings count the same steps; the answers' also per position, each no more than the one before
    assert answered["num_drafts"] == pytest.approx(counted["num_drafts"]), (answered, counted)
    assert answered["mean_acceptance_length"] == pytest.approx(counted["mean_acceptance_length"], rel=0.05)
    assert pos is not None and len(pos) == 3 and all(a >= b for a, b in zip(pos, pos[1:], strict=False)), pos
    assert sum(pos) == pytest.approx(answered["mean_acceptance_length"] - 1.0), answered
    return counted, answered


def test_sglang_serves_an_eagleflow_drafter_and_its_counters_give_the_acceptance(tmp_path):
    from eagleflow.config.train import TrainConfig
    from tests.make_drafter import make_drafter

    drafter = make_drafter(
        tmp_path / "drafter", train=TrainConfig(norm_before_fc=False, norm_before_residual=False), sglang=True
    )
    acc, _ = served(tmp_path, drafter, None)
    al = acc["mean_acceptance_length"]
    # an untrained drafter: its drafts are seldom accepted, but the counters must say how often, within [1, k + 1]
    assert al is not None and 1.0 <= al <= 4.0, acc


def test_sglang_serves_sampled_drafts_of_a_whole_vocabulary_drafter(tmp_path):
    from eagleflow.config.train import TrainConfig
    from tests.make_drafter import make_drafter

    vocab = 2048  # the demo target's: SGLang's rejection sampling needs the drafter over all of it
    drafter = make_drafter(
        tmp_path / "drafter",
        draft_vocab_size=vocab,
        train=TrainConfig(norm_before_fc=False, norm_before_residual=False),
        sglang=True,
    )
    acc, _ = served(tmp_path, drafter, "probabilistic")
    assert acc["mean_acceptance_length"] is not None and 1.0 <= acc["mean_acceptance_length"] <= 4.0, acc
