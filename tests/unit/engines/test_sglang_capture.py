"""eagleflow's SGLang capture plugin (eagleflow.engines.sglang_capture), the part that is not SGLang's: which rows of a
batch's states are whose (a prompt in two chunks, a plain request between capture requests), and the file it writes,
read back by the reader the vLLM plugin's files are read with. SGLang itself is not installed here: its hooks run
on a GPU host (tests/gpu/test_sglang_capture.py); the batch's requests are the fields SGLang's Req carries."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from safetensors import safe_open  # noqa: E402

from eagleflow.engines.capture_plugin import LAYERS_META, XARG, capture_file  # noqa: E402
from eagleflow.engines.sglang_capture import Forward, SglangCapture, spans  # noqa: E402

H = 8


def req(rid: str, prompt: list[int], name: str | None) -> SimpleNamespace:
    # SGLang adds its own "__req__" key to a request's custom_params (schedule_batch.py)
    params = {XARG: name, "__req__": object()} if name else None
    return SimpleNamespace(rid=rid, origin_input_ids=prompt, sampling_params=SimpleNamespace(custom_params=params))


def states(rows: int, seed: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    aux = [torch.randn(rows, H, generator=g, dtype=torch.bfloat16) for _ in range(3)]  # each shape: [T_batch, H]
    return aux, torch.randn(rows, H, generator=g, dtype=torch.bfloat16)  # [T_batch, H]


def read(path) -> tuple[torch.Tensor, torch.Tensor, dict]:
    for _ in range(200):  # the writer thread's file appears under its lock
        if path.exists():
            break
        time.sleep(0.01)
    with safe_open(str(path), "pt") as f:
        return f.get_tensor("hidden_states"), f.get_tensor("token_ids"), f.metadata()


def test_rows_are_cut_per_request_and_a_chunked_prompt_is_written_once_whole(tmp_path):
    cap = SglangCapture(str(tmp_path), (1, 2, 3, 4))
    a, b = list(range(100, 105)), list(range(200, 206))
    batch = SimpleNamespace(reqs=[req("ra", a, "cap-a"), req("plain", [7, 7, 7], None), req("rb", b, "cap-b")])
    rows = cap.rows_of(batch)
    assert [(r.rid, r.name, r.prompt) for r in rows] == [("ra", "cap-a", a), ("rb", "cap-b", b)]
    assert spans([5, 3, 4], [0, 0, 0]) == [(0, 5, 0), (5, 3, 0), (8, 4, 0)]

    # forward 1: a whole (5 rows), the plain request (3), b's first chunk (4 of its 6)
    aux1, final1 = states(12, 0)
    cap.take(Forward(rows, aux1, final1), [5, 3, 4], [0, 0, 0], ["ra", "plain", "rb"])
    got, ids, meta = read(capture_file(tmp_path, "cap-a"))
    want = torch.stack([*(x[0:5] for x in aux1), final1[0:5]], dim=1)  # shape: [T, 4, H]
    assert torch.equal(got, want) and ids.tolist() == a and meta[LAYERS_META] == "1,2,3,4"
    assert not capture_file(tmp_path, "cap-b").exists() and "rb" in cap.pending  # half a prompt is not a file

    # forward 2: b's second chunk (2 rows from position 4), after another request's 1 row
    aux2, final2 = states(3, 1)
    cap.take(Forward(rows[1:], aux2, final2), [1, 2], [9, 4], ["other", "rb"])
    got, ids, _ = read(capture_file(tmp_path, "cap-b"))
    first = torch.stack([*(x[8:12] for x in aux1), final1[8:12]], dim=1)
    second = torch.stack([*(x[1:3] for x in aux2), final2[1:3]], dim=1)
    assert torch.equal(got, torch.cat([first, second])) and ids.tolist() == b
    assert not cap.pending and sorted(p.name for p in tmp_path.glob("*.safetensors")) == [
        "cap-a.safetensors",
        "cap-b.safetensors",
    ]


def test_a_request_that_names_no_file_is_not_captured(tmp_path):
    cap = SglangCapture(str(tmp_path), (1, 2, 3, 4))
    assert cap.rows_of(SimpleNamespace(reqs=[req("r", [1, 2], "../escape")])) == []


def test_data_parallel_attention_turns_capture_off_saying_so(tmp_path, monkeypatch, caplog):
    # under --enable-dp-attention each DP rank holds its own requests' states: writing on TP rank 0 alone would leave
    # the other ranks' capture requests unanswered mid-extract; off at start, the check's request finds it off
    from eagleflow.engines import sglang_capture
    from eagleflow.engines.capture_plugin import DIR_ENV, LAYERS_ENV

    monkeypatch.setenv(DIR_ENV, str(tmp_path))
    monkeypatch.setenv(LAYERS_ENV, "2,30,58,61")
    args = SimpleNamespace(disable_prefill_cuda_graph=True, enable_dp_attention=True)
    runner = SimpleNamespace(is_draft_worker=False, server_args=args, pp_size=1, model=None)
    with caplog.at_level("WARNING", logger="sglang.eagleflow_capture"):
        assert sglang_capture.after_aux_init("result", runner) == "result"
    assert runner._eagleflow_capture is None and "data-parallel attention" in caplog.text
    args.enable_dp_attention = False  # the next reason it stays off here: this fake runner has no decoder
    caplog.clear()
    with caplog.at_level("WARNING", logger="sglang.eagleflow_capture"):
        sglang_capture.after_aux_init("result", runner)
    assert "data-parallel attention" not in caplog.text and "has no EAGLE-3 aux capture" in caplog.text


def test_prefill_graphs_are_read_as_sglang_resolved_them():
    # an explicit --cuda-graph-backend-prefill (or --cuda-graph-config) wins over --disable-prefill-cuda-graph in
    # SGLang's resolution: the flag alone would let capture run beside replayed prefill graphs, writing stale states
    from eagleflow.engines.sglang_capture import prefill_graphs_off

    def args(backend: str | None, flag: bool) -> SimpleNamespace:
        config = SimpleNamespace(prefill=SimpleNamespace(backend=backend)) if backend else None
        return SimpleNamespace(cuda_graph_config=config, disable_prefill_cuda_graph=flag)

    assert prefill_graphs_off(args("disabled", True)) and prefill_graphs_off(args("disabled", False))
    assert not prefill_graphs_off(args("full", True))  # the flag given, and overridden
    assert prefill_graphs_off(args(None, True)) and not prefill_graphs_off(args(None, False))
