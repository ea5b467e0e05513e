"""`python -m eagleflow.engines.preflight`: the preflight as a command (JSON out, exit 1 on any error)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

from eagleflow.config import EngineConfig
from eagleflow.engines.preflight.findings import format_findings, has_errors
from eagleflow.engines.preflight.run import run_preflight


def _name_value(text: str, flag: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name or not value:
        raise SystemExit(f"{flag} takes NAME=VALUE, got {text!r}")
    return name, value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m eagleflow.engines.preflight",
        description="Engine preflight: in seconds, before any weights load, does this engine serve this target with "
        "these drafters?",
    )
    ap.add_argument("--engine-json", default="{}", help="EngineConfig as JSON (default: all defaults).")
    ap.add_argument("--target", required=True, help="Target checkpoint directory.")
    ap.add_argument("--drafter", action="append", default=[], metavar="NAME=DIR", help="A drafter variant.")
    ap.add_argument(
        "--expected-aux",
        action="append",
        default=[],
        metavar="NAME=1,2,3",
        help="Aux layer ids (vLLM convention) drafter NAME was trained on.",
    )
    ap.add_argument("--disk-path", help="Check engine.min_free_disk_gib under this directory.")
    ap.add_argument("--skip-gpu", action="store_true", help="Skip the GPU free-memory check.")
    ap.add_argument("--draft-attention-backend", help="The speculative config's attention_backend, if it sets one.")
    ap.add_argument("--temperatures", default="0", help="Comma-separated temperatures the benchmark measures at.")
    ap.add_argument("--json", dest="json_out", help="Write the findings here as JSON.")
    ap.add_argument(
        "--cache-dir",
        type=Path,
        help="Keep the engine's findings here and reuse them while their inputs are unchanged "
        "(eagleflow.engines.preflight.cache); disk and GPU memory are checked every time.",
    )
    args = ap.parse_args(argv)

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # our findings, not vLLM's import chatter
    engine = EngineConfig.model_validate_json(args.engine_json)
    drafters = dict(_name_value(d, "--drafter") for d in args.drafter)
    expected = {}
    for item in args.expected_aux:
        name, value = _name_value(item, "--expected-aux")
        expected[name] = [int(x) for x in value.split(",")]
    t0 = time.monotonic()
    findings = run_preflight(
        engine,
        args.target,
        drafters,
        expected_aux_layer_ids=expected,
        free_disk_path=args.disk_path,
        check_gpu=not args.skip_gpu,
        draft_attention_backend=args.draft_attention_backend,
        temperatures=[float(t) for t in args.temperatures.split(",")],
        cache=args.cache_dir,
    )
    elapsed = time.monotonic() - t0
    print(format_findings(findings), flush=True)
    if args.json_out:
        Path(args.json_out).write_text(
            json.dumps(
                {
                    "findings": [asdict(f) for f in findings],
                    "errors": sum(f.level == "error" for f in findings),
                    "warnings": sum(f.level == "warning" for f in findings),
                    "elapsed_s": round(elapsed, 3),
                    "python": sys.executable,
                },
                indent=2,
            )
        )
    return 1 if has_errors(findings) else 0


if __name__ == "__main__":
    sys.exit(main())
