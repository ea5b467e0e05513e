"""The drafter production serves, managed by eagleflow: one path production's launch reads, and its history.

    <work_root>/production/<config name>/
        drafter          -> drafters/<seq>   the path production's launch names (`"model"` in --speculative-config)
        drafters/<seq>/  a copy of every drafter deployed: a later cleanup of an export never takes one from production
        history.json     every event, oldest first: adopted, promoted, confirmed by the canary, rejected, rolled back
        pending.json     between a switch and its canary: what to roll back to if production does not come back

    python -m eagleflow.production.served adopt DIR --drafter D          production's drafter before eagleflow managed
    it
    python -m eagleflow.production.served switch DIR --drafter D --run R [--record JSON] [--window W]
    python -m eagleflow.production.served confirm DIR --canary JSON [--record JSON]
    python -m eagleflow.production.served rollback DIR --why TEXT [--window W]
    python -m eagleflow.production.served show DIR

Each prints the history's summary as one JSON line. The link is switched atomically (a new link renamed over
the old), so production's launch always finds a whole drafter. A switch made inside a production window names
that window (`--window`): its guardian then rolls back by itself when production does not come back with the new
drafter (a bad drafter, a bad flag), without waiting for the flow, which may be gone. Standard library only: the
guardian imports it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from eagleflow import EagleflowError
from eagleflow.util.files import read_json, write_json_atomic

LINK, DRAFTERS, HISTORY, PENDING = "drafter", "drafters", "history.json", "pending.json"
WINDOW_MARK = "switched.json"  # in a production window's dir: the switch its guardian may undo


class ServedDrafterError(EagleflowError):
    """The managed drafter cannot be switched or rolled back; the message says why and what to do."""


def served_dir(work_root: str, name: str) -> str:
    """Where a run config's production drafter lives on the host (`production.drafter_path` is its link)."""
    return f"{work_root.rstrip('/')}/production/{name}"


def link_path(work_root: str, name: str) -> str:
    return f"{served_dir(work_root, name)}/{LINK}"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def history(d: Path) -> list[dict[str, Any]]:
    return (read_json(d / HISTORY) or {}).get("events", [])


def _append(d: Path, event: dict[str, Any]) -> None:
    events = history(d)
    events.append({"at": _now(), **event})
    write_json_atomic(d / HISTORY, {"events": events}, indent=1)


def states(events: list[dict[str, Any]]) -> dict[int, str]:
    """Each deployed drafter's state: the last event about it says (pending, good, rejected)."""
    out: dict[int, str] = {}
    for e in events:
        out[e["seq"]] = {
            "adopt": "good",
            "promote": "pending",
            "confirm": "good",
            "reject": "rejected",
            "rollback": "good",
        }[e["action"]]
    return out


def current(d: Path) -> int | None:
    """The drafter the link names now (its seq), None before anything was deployed."""
    link = d / LINK
    if not link.is_symlink():
        return None
    return int(Path(os.readlink(link)).name)


def _drafter_of(d: Path, seq: int) -> dict[str, Any]:
    """The drafter's deploy event, with its latest promotion record (given at the switch or at the confirm)."""
    events = [e for e in history(d) if e["seq"] == seq]
    first = next((e for e in events if e["action"] in ("adopt", "promote")), None)
    if first is None:
        raise ServedDrafterError(f"{d / HISTORY} names no drafter {seq}")
    records = [e["record"] for e in events if e.get("record")]
    return {**first, "record": records[-1] if records else None}


def last_good(d: Path, besides: int | None = None) -> int | None:
    """The latest drafter in state good other than `besides`: what a rollback goes back to."""
    good = [seq for seq, s in states(history(d)).items() if s == "good" and seq != besides]
    order = {e["seq"]: i for i, e in enumerate(history(d))}  # the latest event about each drafter
    return max(good, key=lambda s: order[s]) if good else None


def good_seq(d: Path) -> int | None:
    """The drafter production serves while it is good, else its last good one (a drafter just switched in waits
    for its canary): what a new drafter is measured against. None when nothing good is managed in `d`."""
    seq = current(d) if d.is_dir() else None
    if seq is not None and states(history(d)).get(seq) != "good":
        seq = last_good(d, besides=seq)
    return seq


def good_drafter(d: Path) -> str | None:
    """The directory of `good_seq`'s drafter; None when there is none."""
    seq = good_seq(d)
    path = d / DRAFTERS / str(seq) if seq is not None else None
    return str(path) if path is not None and (path / "config.json").is_file() else None


def _relink(d: Path, seq: int) -> None:
    tmp = d / f".{LINK}.{os.getpid()}"
    tmp.unlink(missing_ok=True)
    os.symlink(f"{DRAFTERS}/{seq}", tmp)
    os.replace(tmp, d / LINK)  # atomic: production's next start reads the old drafter or the new, never neither


def _copy_in(d: Path, source: Path) -> int:
    if not (source / "config.json").is_file():
        raise ServedDrafterError(
            f"{source} holds no drafter (no config.json): give an exported drafter's vllm directory"
        )
    seqs = [int(p.name) for p in (d / DRAFTERS).iterdir() if p.name.isdigit()] if (d / DRAFTERS).is_dir() else []
    seq = max(seqs, default=-1) + 1
    tmp = d / DRAFTERS / f".{seq}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(source, tmp, symlinks=False)
    os.replace(tmp, d / DRAFTERS / str(seq))  # a half-copied drafter is never named by a seq
    return seq


def adopt(d: Path, source: Path) -> dict[str, Any]:
    """Take production's present drafter as the first good one (no-op once anything is deployed)."""
    d.mkdir(parents=True, exist_ok=True)
    if history(d):
        return summary(d)
    seq = _copy_in(d, source)
    _append(
        d,
        {
            "action": "adopt",
            "seq": seq,
            "source": str(source),
            "why": "what production served before eagleflow managed its drafter",
        },
    )
    _relink(d, seq)
    return summary(d)


def switch(
    d: Path, source: Path, run: str, record: dict[str, Any] | None = None, window: Path | None = None
) -> dict[str, Any]:
    """Deploy `source`: copy it in, name it pending, point the link at it. Production reads it at its next start."""
    d.mkdir(parents=True, exist_ok=True)
    seq = _copy_in(d, source)
    before = current(d)
    _append(
        d, {"action": "promote", "seq": seq, "source": str(source), "run": run, "record": record, "previous": before}
    )
    write_json_atomic(d / PENDING, {"seq": seq, "previous": before, "at": _now()}, indent=1)
    _relink(d, seq)
    if window is not None:
        write_json_atomic(window / WINDOW_MARK, {"dir": str(d), "seq": seq}, indent=1)
    return summary(d)


def confirm(d: Path, canary: dict[str, Any], record: dict[str, Any] | None = None) -> dict[str, Any]:
    """Production's figures found the serving drafter good: it becomes what a later rollback returns to.
    `record`: its promotion record, when the promotion was decided on these figures (the nightly)."""
    seq = current(d)
    if seq is None:
        raise ServedDrafterError(f"nothing is deployed at {d}")
    _append(d, {"action": "confirm", "seq": seq, "canary": canary, "record": record})
    (d / PENDING).unlink(missing_ok=True)
    return summary(d)


def rollback(d: Path, why: str, canary: dict[str, Any] | None = None, window: Path | None = None) -> dict[str, Any]:
    """Reject the serving drafter and point the link back at the last good one (production reads it at its next
    start)."""
    seq = current(d)
    if seq is None:
        raise ServedDrafterError(f"nothing is deployed at {d}: there is nothing to roll back")
    target = last_good(d, besides=seq)
    if target is None:
        raise ServedDrafterError(
            f"no earlier good drafter at {d} to roll back to (history: {d / HISTORY}); point production "
            "at a drafter with `eagleflow promote CONFIG --drafter DIR`"
        )
    _append(d, {"action": "reject", "seq": seq, "why": why, "canary": canary})
    _append(d, {"action": "rollback", "seq": target, "from": seq, "why": why})
    _relink(d, target)
    (d / PENDING).unlink(missing_ok=True)
    if window is not None:
        (window / WINDOW_MARK).unlink(missing_ok=True)
    return summary(d)


def canary_al(d: Path, seq: int) -> tuple[float, str] | None:
    """Drafter `seq`'s AL on production by its latest canary, when it was confirmed good on one (the confirm event
    keeps the canary's figures), and when it was measured."""
    for e in reversed(history(d)):
        figures = e.get("canary") or {}
        if (
            e["seq"] == seq
            and e["action"] == "confirm"
            and isinstance(figures.get("mean_acceptance_length"), (int, float))
        ):
            return float(figures["mean_acceptance_length"]), str(figures.get("at") or e.get("at"))
    return None


def offline_al(drafter: Path, source: str | None = None) -> tuple[float, str] | None:
    """A drafter's offline estimate and where it was read: the simulated AL on the held-out split that eagleflow's
    trainer measured and its export wrote into the drafter's config.json (`eagleflow.validation`), else the export
    manifest beside the directory it was copied from (`metrics.acceptance_length_sim`). None for a drafter eagleflow
    did not train (a public one)."""
    try:
        val = (json.loads((drafter / "config.json").read_text()).get("eagleflow") or {}).get("validation") or {}
    except (OSError, ValueError):
        val = {}
    if isinstance(val.get("acceptance_length"), (int, float)):
        return float(val["acceptance_length"]), "config.json"
    manifest = read_json(Path(source).parent / "manifest.json") if source else None
    al = ((manifest or {}).get("metrics") or {}).get("acceptance_length_sim")
    if isinstance(al, (int, float)):
        return float(al), "its export manifest"
    return None


def expected_al(link: Path) -> tuple[float | None, str]:
    """What the drafter the link names should serve, and where that figure comes from: its latest canary on
    production once it was confirmed good there (production's own count on the held-out prompts: the last good
    drafter's figure), else its offline estimate; (None, why) when it has neither."""
    d, seq = link.parent, current(link.parent)
    if seq is None:
        return None, f"{link} is not a link eagleflow manages"
    if got := canary_al(d, seq):
        return got[0], f"drafter {seq}'s canary on production ({got[1]})"
    try:
        source = _drafter_of(d, seq).get("source")
    except ServedDrafterError:
        source = None
    if got := offline_al(d / DRAFTERS / str(seq), source):
        return got[0], f"drafter {seq}'s offline estimate ({got[1]})"
    return None, f"drafter {seq} has no offline estimate (no eagleflow manifest) and no canary on production"


def summary(d: Path) -> dict[str, Any]:
    seq = current(d)
    events = history(d)
    st = states(events)
    serving = _drafter_of(d, seq) if seq is not None else None
    return {
        "dir": str(d),
        "link": str(d / LINK),
        "serving": seq,
        "state": st.get(seq) if seq is not None else None,
        "source": serving["source"] if serving else None,
        "record": serving.get("record") if serving else None,
        "drafter": str(d / DRAFTERS / str(seq)) if seq is not None else None,
        "last_good": last_good(d, besides=seq),
        "good": good_seq(d),
        "pending": read_json(d / PENDING),
        "events": events,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("adopt", "switch", "confirm", "rollback", "show"):
        p = sub.add_parser(name)
        p.add_argument("dir", type=Path)
        if name in ("adopt", "switch"):
            p.add_argument("--drafter", type=Path, required=True)
        if name == "switch":
            p.add_argument("--run", required=True)
        if name in ("switch", "confirm"):
            p.add_argument("--record", type=json.loads, default=None)
        if name in ("switch", "rollback"):
            p.add_argument("--window", type=Path, default=None)
        if name in ("confirm", "rollback"):
            p.add_argument("--canary", type=json.loads, default=None)
        if name == "rollback":
            p.add_argument("--why", required=True)
    a = ap.parse_args(argv)
    try:
        if a.cmd == "adopt":
            out = adopt(a.dir, a.drafter)
        elif a.cmd == "switch":
            out = switch(a.dir, a.drafter, a.run, a.record, a.window)
        elif a.cmd == "confirm":
            out = confirm(a.dir, a.canary or {}, a.record)
        elif a.cmd == "rollback":
            out = rollback(a.dir, a.why, a.canary, a.window)
        else:
            out = summary(a.dir)
    except (ServedDrafterError, OSError) as exc:
        print(json.dumps({"error": str(exc)}))
        return 1
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
