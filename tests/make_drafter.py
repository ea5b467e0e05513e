"""A drafter for the demo target (or another), exported by the project's own code (host environment).

    .hostenv/bin/python tests/make_drafter.py OUT_DIR [--seed N] [--target DIR] [--draft-vocab-size N]

The weights are freshly initialised, not trained: the serving tests need an engine that loads and
runs an EAGLE-3 drafter beside the target (speed and faults), not a good one. Its config carries
no offline estimate, like a public drafter.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from eagleflow.config.train import TrainConfig  # noqa: E402
from eagleflow.drafter.checkpoint import save_checkpoint  # noqa: E402
from eagleflow.drafter.model import Eagle3Drafter  # noqa: E402
from eagleflow.drafter.target import arch_for_target, read_target_head  # noqa: E402
from eagleflow.drafter.vllm_export import export_vllm  # noqa: E402
from eagleflow.drafter.vocab import DraftVocab  # noqa: E402
from eagleflow.engines.preflight.layer_ids import sglang_config_ids  # noqa: E402


def make_drafter(
    out_dir: Path,
    seed: int = 0,
    draft_vocab_size: int = 256,
    target_dir: Path | None = None,
    train: TrainConfig | None = None,
    sglang: bool = False,
) -> Path:
    """The drafter's shape follows the target's (train.drafter_arch auto: an MLA drafter for an MLA target) and
    `train`'s layout fields (its norms; the defaults without it). `sglang`: eagle_config's ids as SGLang reads them,
    as the export stage writes them for engine.kind 'sglang'."""
    torch.manual_seed(seed)
    target = read_target_head(target_dir or ROOT / "demo" / "target")
    arch = arch_for_target(target, train or TrainConfig(), draft_vocab_size)
    model = Eagle3Drafter(arch, target.embed_tokens)
    vocab = DraftVocab(torch.arange(draft_vocab_size), target.vocab_size)
    with tempfile.TemporaryDirectory() as tmp:
        save_checkpoint(Path(tmp) / "ckpt", model, vocab, {"aux_layer_ids": [1, 2, 3], "epoch": 0})
        ids = sglang_config_ids([1, 2, 3], deepseek=arch.attention == "mla") if sglang else None
        return export_vllm(Path(tmp) / "ckpt", out_dir, [1, 2, 3], eagle_config_ids=ids)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("out_dir", type=Path)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target", type=Path, default=None, help="the target's directory (default: demo/target)")
    p.add_argument("--draft-vocab-size", type=int, default=256)
    p.add_argument(
        "--sglang",
        action="store_true",
        help="the layout SGLang serves as trained: train.norm_before_fc and train.norm_before_residual off, "
        "eagle_config's ids in SGLang's reading (an MLA target's [1, 2, 3] has none: the export refuses it)",
    )
    args = p.parse_args()
    train = TrainConfig(norm_before_fc=False, norm_before_residual=False) if args.sglang else None
    print(make_drafter(args.out_dir, args.seed, args.draft_vocab_size, args.target, train, sglang=args.sglang))
