"""The capture plugin's bookkeeping (eagleflow.engines.capture_plugin), without an engine: a prompt filled by
position whatever the chunks and their order, a recomputed chunk written over, the generated token's row dropped;
the names a request may give its file. (In a real vLLM server: tests/integration/stages/test_extract.py.)"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from eagleflow.engines.capture_plugin import Pending, capture_file, valid_name  # noqa: E402


def test_a_prompt_is_whole_once_every_position_is_in_whatever_the_chunks():
    p = Pending("r", [5, 6, 7, 8, 9], n_layers=2, hidden=3, dtype=torch.float32, pin=False)
    rows = torch.arange(5 * 2 * 3, dtype=torch.float32).reshape(5, 2, 3)  # [T, n_layers, H]

    def chunk(r):  # what the runner hands over: one [n, H] tensor a layer
        return list(r.unbind(1))

    assert not p.take(2, chunk(rows[2:4]))  # a middle chunk first (recomputed after a preemption, say)
    assert not p.take(0, chunk(torch.zeros(2, 2, 3)))
    assert not p.take(0, chunk(rows[0:2]))  # the same positions again: the later rows stand
    assert p.take(4, chunk(torch.cat([rows[4:5], torch.full((1, 2, 3), -1.0)])))  # the last row + a generated one
    assert torch.equal(p.hidden_states(), rows) and p.token_ids.tolist() == [5, 6, 7, 8, 9]


@pytest.mark.parametrize(
    ("name", "ok"),
    [("eagleflow-0a1b2c-17", True), ("a.b_c", True), ("", False), (".hidden", False), ("../x", False), ("a/b", False)],
)
def test_a_capture_name_is_a_plain_file_name(name, ok, tmp_path):
    assert valid_name(name) is ok
    if ok:
        assert capture_file(tmp_path, name).parent == tmp_path
