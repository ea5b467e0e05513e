"""A drafter swapped into a running vLLM engine (vLLM's draft weight update over CUDA IPC): seconds, not a load.

    python -m eagleflow.production.swap send URL DRAFTER_DIR     the sender (a child of `swap_drafter`)

The engine must be launched with `--weight-transfer-config '{"backend": "ipc"}'` and
`VLLM_ALLOW_INSECURE_SERIALIZATION=1`: the handles travel pickled over HTTP, so whoever reaches the port
can run code in the engine. Only where production's port is reachable from the host alone (docs/production.md).

The order is vLLM's RLHF one: /init_weight_transfer_engine (a no-op for ipc), /start_draft_weight_update,
/update_weights with one {GPU uuid: CUDA IPC handle} map per tensor, /finish_weight_update. The sender puts
a copy of every tensor on each GPU it sees, because each tensor-parallel worker rebuilds the tensor from the
handle of its own GPU and shards it itself; it lives until /update_weights has answered (the engine copies
the weights out of the sender's memory). Same architecture only: a drafter whose tensors differ in name,
shape or dtype is refused before anything is sent (`incompatible`), and production is restarted instead.
"""

from __future__ import annotations

import argparse
import base64
import json
import pickle
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from eagleflow import EagleflowError
from eagleflow.production.pause import served_routes
from eagleflow.util import http

SWAP_ROUTES = ("/init_weight_transfer_engine", "/start_draft_weight_update", "/update_weights", "/finish_weight_update")
WEIGHTS = "model.safetensors"
SEND_TIMEOUT_S = 600.0


class SwapError(EagleflowError):
    """The swap did not happen; production is restarted with the drafter instead."""


def layout(drafter: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{tensor name: (dtype, shape)} from the safetensors header (no tensor is read)."""
    from safetensors import safe_open

    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for f in sorted(drafter.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():
                s = st.get_slice(name)
                out[name] = (str(s.get_dtype()), tuple(s.get_shape()))
    return out


def _architecture(drafter: Path) -> Any:
    try:
        cfg = json.loads((drafter / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return cfg.get("architectures"), cfg.get("draft_vocab_size"), cfg.get("hidden_size")


def incompatible(served: Path | None, new: Path) -> str | None:
    """Why `new` cannot be swapped in for `served` (None: it can)."""
    if served is None or not served.is_dir():
        return "the drafter production serves is not known (no drafter was recorded when it was paused)"
    if not any(new.glob("*.safetensors")):
        return f"{new} holds no safetensors weights"
    if _architecture(served) != _architecture(new):
        return f"{new} is another architecture than {served} (config.json architectures, sizes)"
    a, b = layout(served), layout(new)
    if a != b:
        diff = sorted(set(a.items()) ^ set(b.items()))[:4]
        return f"{new}'s tensors differ from {served}'s in name, shape or dtype (first: {diff})"
    return None


def routes_missing(base: str) -> list[str]:
    """The weight-update routes production does not serve (all of them when it does not say)."""
    try:
        routes = served_routes(base)
    except (httpx.HTTPError, ValueError):
        routes = set()
    return [p for p in SWAP_ROUTES if p not in routes]


def why_not(enabled: bool, base: str, served: Path | None, new: Path) -> str | None:
    """Why drafter `new`, switched in while production slept, cannot be swapped in for `served` (None: it can)."""
    if not enabled:
        return "production.swap_drafter is off"
    if missing := routes_missing(base):
        return f"production serves no {', '.join(missing)}"
    return incompatible(served, new)


def send(url: str, drafter: Path) -> dict[str, Any]:
    """(The sender, a process of its own.) The drafter's tensors onto every visible GPU, their CUDA IPC handles
    to the engine through POST /update_weights (non-packed: vLLM's IPCWeightTransferEngine format)."""
    import torch
    from safetensors.torch import load_file
    from torch.multiprocessing.reductions import reduce_tensor

    t0 = time.perf_counter()
    host_tensors = {}
    for f in sorted(drafter.glob("*.safetensors")):
        host_tensors.update(load_file(str(f)))
    keep: list[torch.Tensor] = []  # the GPU copies stay alive until the engine has read them
    names, dtypes, shapes, handles = [], [], [], []
    devices = range(torch.cuda.device_count())
    uuids = [str(torch.cuda.get_device_properties(i).uuid) for i in devices]
    for name, t in host_tensors.items():
        per_gpu = {}
        for i, uuid in zip(devices, uuids):
            g = t.to(f"cuda:{i}").contiguous()
            keep.append(g)
            per_gpu[uuid] = reduce_tensor(g)[1]
        names.append(name)
        dtypes.append(str(t.dtype).removeprefix("torch."))
        shapes.append(list(t.shape))
        handles.append(per_gpu)
    for i in devices:
        torch.cuda.synchronize(i)
    t1 = time.perf_counter()
    payload = {
        "update_info": {
            "names": names,
            "dtype_names": dtypes,
            "shapes": shapes,
            "packed": False,
            "ipc_handles_pickled": base64.b64encode(pickle.dumps(handles)).decode(),
        }
    }
    r = httpx.post(f"{url}/update_weights", json=payload, timeout=SEND_TIMEOUT_S)
    t2 = time.perf_counter()
    return {
        "status": r.status_code,
        "body": r.text[:1000],
        "tensors": len(names),
        "gpus": len(uuids),
        "bytes": sum(t.numel() * t.element_size() for t in host_tensors.values()),
        "load_s": round(t1 - t0, 3),
        "update_weights_s": round(t2 - t1, 3),
    }


def _post(base: str, path: str, **kw: Any) -> None:
    try:
        r = http.client().post(f"{base}{path}", timeout=SEND_TIMEOUT_S, **kw)
    except httpx.HTTPError as exc:
        raise SwapError(f"POST {base}{path}: {type(exc).__name__}: {exc}") from exc
    if r.status_code != 200:
        raise SwapError(f"POST {base}{path} answered {r.status_code}: {r.text[:500]}")


def swap_drafter(base: str, drafter: Path, python: str = sys.executable) -> dict[str, Any]:
    """Swap `drafter` into production at `base`; raises SwapError (the engine keeps its old draft weights
    when the update never started, and is restarted by the caller otherwise)."""
    t0 = time.monotonic()
    _post(base, "/init_weight_transfer_engine", json={"init_info": {}})
    _post(base, "/start_draft_weight_update")
    try:
        p = subprocess.run(
            [python, "-m", "eagleflow.production.swap", "send", base, str(drafter)],
            capture_output=True,
            text=True,
            timeout=SEND_TIMEOUT_S + 60,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        raise SwapError(f"the drafter's sender did not finish within {SEND_TIMEOUT_S + 60:.0f} s") from exc
    line = next((ln for ln in reversed(p.stdout.splitlines()) if ln.startswith("{")), None)
    sent = json.loads(line) if line else {}
    if p.returncode != 0 or sent.get("status") != 200:
        raise SwapError(
            f"sending {drafter} to {base} failed (exit {p.returncode}): {sent.get('body') or p.stderr[-1500:]}"
        )
    _post(base, "/finish_weight_update")
    return {"swap_s": round(time.monotonic() - t0, 3), "swapped_in": str(drafter), "sender": sent}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m eagleflow.production.swap",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("send")
    p.add_argument("url")
    p.add_argument("drafter", type=Path)
    args = parser.parse_args(argv)
    print(json.dumps(send(args.url.rstrip("/"), args.drafter)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
