"""Which torch device a stage computes on (eagleflow.drafter.devices.pick_device), on this machine."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from eagleflow.drafter.devices import pick_device  # noqa: E402


def test_pick_device():
    assert pick_device("cpu", "train.device") == torch.device("cpu")
    if torch.cuda.is_available():
        assert pick_device("auto", "train.device", local_rank=0) == torch.device("cuda", 0)
    else:
        assert pick_device("auto", "train.device", local_rank=1) == torch.device("cpu")
        with pytest.raises(ValueError, match="extract.device is 'cuda' but torch sees no CUDA device"):
            pick_device("cuda", "extract.device")
