"""The nightly decides on evidence (issue 44), replayed as a new user ran it: `python -m flows.retrain` on a copy
of the demo config whose `nightly.source` is a directory of the user's own prompts (here: questions about Python
standard-library functions, written from their docstrings), growing between nights; real vLLM (CPU), the demo
target, the session's Prefect server.

- Night 1 is not promoted (its gate's acceptance floor set out of reach, so the refusal is certain): production
  keeps serving no drafter.
- Night 2, with new prompts appended and no promoted drafter to continue, is a full run on the whole pool (night 1's
  batch and its own, every sequence), not tonight's batch and a replay sample; its holdout AL is within noise of
  night 1's; the report says what it trained on and how many sequences it saw, and which interval decided.
- Night 3, with nothing appended, says "nothing new" in the flow run's state message and in `eagleflow status`.
"""

from __future__ import annotations

import inspect
import json
import re

import pytest
import yaml

from tests.conftest import ROOT, free_port
from tests.e2e.conftest import newest_report, run_cli, run_flow

pytestmark = pytest.mark.e2e
MODULES = ["json", "os.path", "itertools", "functools", "collections", "string", "textwrap", "statistics", "shutil"]


def stdlib_prompts() -> list[str]:
    """One question a public function of a few standard-library modules, written from its docstring's first line."""
    import importlib

    out = []
    for name in MODULES:
        mod = importlib.import_module(name)
        for attr in sorted(dir(mod)):
            fn = getattr(mod, attr)
            doc = (inspect.getdoc(fn) or "").split("\n")[0].strip()
            if attr.startswith("_") or not callable(fn) or not doc or len(doc) > 160:
                continue
            out.append(f'What does `{name}.{attr}` do? Its documentation says: "{doc}". Give a short example.')
    return list(dict.fromkeys(out))


@pytest.fixture(scope="module")
def three_nights(prefect_server, tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("evidence")
    source = work / "source"
    source.mkdir()
    prompts = stdlib_prompts()
    assert len(prompts) >= 120, len(prompts)

    def append(name: str, chunk: list[str]) -> None:
        (source / name).write_text("".join(json.dumps({"prompt": p}) + "\n" for p in chunk))

    data = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    data["name"] = "evidence"
    data["host"].update(work_root=str(work / "runs"), python=str(ROOT / ".hostenv" / "bin" / "python"))
    data["target"]["model_path"] = str(ROOT / "demo" / "target")
    data["generate"].update(
        prompts_path=str(ROOT / "demo" / "prompts.jsonl"), num_samples=70, holdout=10, max_tokens=96
    )
    data["engine"]["port"] = free_port()
    data["train"].update(epochs=2)
    # Night 2 reuses night 1's baseline by its key, whatever the suite's other processes did to the load between.
    data["benchmark"].update(
        num_prompts=8,
        max_tokens=48,
        warmup_requests=1,
        temperatures=[0.0],
        concurrencies=[1],
        reuse_max_load_change=1.0,
    )
    data["nightly"] = {**data.get("nightly", {}), "source": str(source), "new_samples": 40, "decision_reruns": 0}
    data["report_dir"] = str(work / "reports")
    config = work / "evidence.yaml"
    config.write_text(yaml.safe_dump(data))

    nights = []
    append("a.jsonl", prompts[:70])
    for k, (gate, chunk) in enumerate([(["--min-acceptance-length", "50"], None), ([], prompts[70:110]), ([], None)]):
        if chunk:
            append(f"{'abc'[k]}.jsonl", chunk)
        proc = run_flow(
            prefect_server,
            str(config),
            "--min-speedup",
            "0",
            *(gate or ["--min-acceptance-length", "1.0"]),
            module="flows.retrain",
        )
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
        nights.append(proc)
    return {"config": config, "work": work, "nights": nights, "report": newest_report(work / "reports", 0)}


def test_a_night_without_a_drafter_to_continue_trains_on_the_whole_pool(three_nights):
    # the record of nights on the host: the report's rows, then each night's decision (written after its report)
    rows = json.loads((three_nights["work"] / "runs" / "nightly" / "evidence" / "nights.json").read_text())
    assert [n["train_sequences"] for n in three_nights["report"]["nights"]] == [n["train_sequences"] for n in rows]
    assert [n["night"] for n in rows] == [1, 2]
    first, second = rows
    assert first["promoted"] is False and "gate's floor 50.00" in first["decided_by"]
    assert second["warm_start"] is None and second["trained_on"] == "the whole pool"
    ledger = json.loads((three_nights["work"] / "runs" / "nightly" / "evidence" / "ledger.json").read_text())
    assert [len(b["prompts"]) for b in ledger["batches"]] == [60, 40]
    # every train sequence of the pool (the holdout excepted): night 1's all and its own 40 (less any too short),
    # where tonight's batch and a replay sample (nightly.replay 1.0) would have been 40 + 40
    new_tonight = second["train_sequences"] - first["train_sequences"]
    assert 30 <= new_tonight <= 40 and second["train_sequences"] > 80, (first, second)
    # within noise of the first night on the same held-out prompts
    assert second["holdout_al"] >= first["holdout_al"] - 0.15, (first, second)
    assert second["decided_by"], second
    print(
        "nights:",
        [
            (n["night"], n["trained_on"], n["train_sequences"], n["holdout_al"], n["promoted"], n["decided_by"])
            for n in rows
        ],
    )


def test_a_night_with_nothing_new_says_so_in_its_state_and_in_status(three_nights, prefect_server):
    third = three_nights["nights"][2]
    assert "nothing new tonight" in third.stdout, third.stdout[-2000:]
    status = run_cli(prefect_server, "status", str(three_nights["config"]), "--limit", "1")
    assert status.returncode == 0, status.stdout[-2000:]
    assert re.search(r"Completed.*\n\s+nothing new tonight", status.stdout), status.stdout[-3000:]
