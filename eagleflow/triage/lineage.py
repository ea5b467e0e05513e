"""Where a drafter's training states came from: the train and extract stages behind an eagleflow drafter,
and whether their target is the one being served (torch-free: read before any probe decides to run)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from eagleflow.contracts.manifest import Manifest, read_manifest


def lineage(drafter_dir: str) -> tuple[Manifest | None, Manifest | None]:
    """The train and extract manifests an eagleflow drafter came from (its config names its checkpoint,
    <work_root>/train/<key>/checkpoints/epoch-N; the train manifest names the extract key); (None, None)
    for a drafter trained elsewhere."""
    try:
        meta = json.loads((Path(drafter_dir) / "config.json").read_text()).get("eagleflow") or {}
    except (OSError, ValueError):
        return None, None
    ckpt = meta.get("checkpoint")
    if not ckpt:
        return None, None
    train_dir = Path(ckpt).parent.parent
    try:
        train = read_manifest(train_dir / "manifest.json")
        key = train.upstream.get("extract")
        extract = read_manifest(train_dir.parent.parent / "extract" / key / "manifest.json") if key else None
    except (OSError, ValueError):
        return None, None
    return train, extract


def trained_target(extract: Manifest) -> str | None:
    """The target model path the extract stage computed its states with (its request.json)."""
    try:
        req = json.loads((Path(extract.dir) / "request.json").read_text())
        return req["config"]["target"]["model_path"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


SAMPLES, SAMPLE_BYTES = 16, 1 << 16


def sampled_digest(path: Path) -> str:
    """sha256 over a file's size and 16 blocks of 64 KiB spread through it: 1 MiB read per weight file, so a
    1T-parameter checkpoint's 64 shards cost a second, where hashing them whole would take an hour."""
    h = hashlib.sha256()
    size = path.stat().st_size
    h.update(str(size).encode())
    with open(path, "rb") as f:
        for i in range(SAMPLES):
            f.seek(max(0, (size - SAMPLE_BYTES) * i // (SAMPLES - 1)))
            h.update(f.read(SAMPLE_BYTES))
    return h.hexdigest()


def same_target(a: str, b: str) -> bool:
    """Two target directories hold the same model: the same config and the same weight files (names, sizes
    and sampled contents: a re-exported or re-quantized checkpoint of the same shape differs in the latter)."""
    pa, pb = Path(a), Path(b)
    if pa.resolve() == pb.resolve():
        return True
    try:
        if json.loads((pa / "config.json").read_text()) != json.loads((pb / "config.json").read_text()):
            return False
        digests = lambda p: sorted((f.name, sampled_digest(f)) for f in p.glob("*.safetensors"))  # noqa: E731
        return digests(pa) == digests(pb)
    except (OSError, ValueError):
        return False
