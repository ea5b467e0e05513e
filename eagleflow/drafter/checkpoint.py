"""The trainer's checkpoints: one directory per unit (epoch or step), written to a temp dir and renamed.

    <dir>/model.safetensors   float32 drafter weights under vLLM's names (+ d2t/t2d)
    <dir>/drafter.json        arch, aux layer ids, vocab sizes, provenance, the epoch's metrics
    <dir>/trainer_state.pt    optimizer, step, data position, RNG: what a resume needs (not in exports)

Every checkpoint carries its provenance (code version, git SHA, package versions, argv).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from eagleflow import __version__
from eagleflow.drafter.arch import DrafterArch
from eagleflow.drafter.errors import FormatError
from eagleflow.drafter.model import Eagle3Drafter
from eagleflow.drafter.vocab import DraftVocab
from eagleflow.util.files import fresh_temp_dir, replace_dir

CHECKPOINT_WEIGHTS = "model.safetensors"  # float32 drafter weights + d2t/t2d, names as vLLM's
CHECKPOINT_META = "drafter.json"  # arch, aux layer ids, vocab size, provenance, metrics
CHECKPOINT_STATE = "trainer_state.pt"  # optimizer + step + RNG, for resume


def provenance() -> dict[str, Any]:
    """Where a checkpoint came from: code version, git SHA, package versions, argv."""
    sha = None
    try:
        root = Path(__file__).resolve().parents[2]
        sha = (
            subprocess.run(
                ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        pass
    # from the installed metadata: importing transformers for its version took ~2 CPU-seconds a stage
    from importlib.metadata import version

    return {
        "eagleflow": __version__,
        "git_sha": sha,
        "torch": torch.__version__,
        "transformers": version("transformers"),
        "safetensors": version("safetensors"),
        "python": sys.version.split()[0],
        "argv": list(sys.argv),
        "created": time.time(),
    }


# ------------------------------------------------------------------------------- checkpoints


def vocab_tensors(vocab: DraftVocab) -> dict[str, torch.Tensor]:
    if vocab.is_full:
        return {}
    return {"d2t": vocab.d2t.contiguous(), "t2d": vocab.t2d.contiguous()}


def drafter_tensors(model: Eagle3Drafter, vocab: DraftVocab, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The drafter's checkpoint tensors under vLLM's names (see the module docstring)."""
    tensors = {name: p.detach().to("cpu", dtype).contiguous() for name, p in model.state_dict().items()}
    tensors.update(vocab_tensors(vocab))
    return tensors


def save_checkpoint(
    path: str | Path,
    model: Eagle3Drafter,
    vocab: DraftVocab,
    meta: dict[str, Any],
    trainer_state: dict[str, Any] | None = None,
) -> Path:
    """`path/` = model.safetensors (float32) + drafter.json (+ trainer_state.pt); written to a temp dir, renamed."""
    final = Path(path)
    tmp = fresh_temp_dir(final)
    save_file(drafter_tensors(model, vocab, torch.float32), str(tmp / CHECKPOINT_WEIGHTS))
    full_meta = {
        "arch": model.arch.to_dict(),
        "target_vocab_size": vocab.target_vocab_size,
        "draft_vocab_size": vocab.size,
        "provenance": provenance(),
        **meta,
    }
    (tmp / CHECKPOINT_META).write_text(json.dumps(full_meta, indent=2, sort_keys=True))
    if trainer_state is not None:
        torch.save(trainer_state, tmp / CHECKPOINT_STATE)
    replace_dir(tmp, final)
    return final


def load_checkpoint(path: str | Path) -> tuple[DrafterArch, dict[str, torch.Tensor], DraftVocab, dict]:
    """(arch, weights without d2t/t2d, vocab, meta) of a trainer checkpoint directory."""
    path = Path(path)
    meta_path, weights_path = path / CHECKPOINT_META, path / CHECKPOINT_WEIGHTS
    for p in (meta_path, weights_path):
        if not p.is_file():
            raise FormatError(f"checkpoint file {p} is missing: {path} is not a complete trainer checkpoint")
    meta = json.loads(meta_path.read_text())
    arch = DrafterArch(**meta["arch"])
    weights = load_file(str(weights_path))
    d2t = weights.pop("d2t", None)
    weights.pop("t2d", None)
    vocab = DraftVocab.full(arch.vocab_size) if d2t is None else DraftVocab.from_d2t(d2t, arch.vocab_size)
    return arch, weights, vocab, meta
