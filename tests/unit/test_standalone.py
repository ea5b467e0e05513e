"""The project speaks of itself only: no tracked file cites a file outside the repository, names the environment
it was built in, carries an absolute path of a machine a result was made on, or says "the seeds" for the
reference run (docs/reference-run.md describes it once, and every figure from it cites that page).

Reads the tracked files (`git ls-files`), so a new file is checked the day it is added. Data the project ships
as content (the demo's prompts, its tokenizer) is not the project speaking and is left out.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.conftest import ROOT

# Each pattern with what it catches, its words assembled from pieces so that this file, read as text, names none of
# what it looks for (a check of the whole checkout, this file included, finds nothing here).
SHARED, DESIGN, LIBRARY = "sha" + "red", "DES" + "IGN", "lib" + "rary"
RULES = {
    "a file outside the repository": (
        rf"\.\./{SHARED}\b|\b{SHARED}/({DESIGN}|GPU|STYLE|tools)|{DESIGN}\.md|\.{LIBRARY}/"
    ),
    "the environment it was built in": r"\blent\b|nvidia-h200|farm-(studio|bench)|\bdevice (tool|call|time)\b",
    "an absolute machine path": r"(?<![\w.])/(work|root|old_root)/|(?<![\w.])/home/[a-z]",
    "'the seeds' for the reference run": r"(?i)\bthe seeds\b",
}
SKIP = ("tests/unit/test_standalone.py", "demo/prompts.jsonl", "demo/target/", "demo/target-mla/")


def tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    return [f for f in out.splitlines() if not f.startswith(SKIP)]


@pytest.mark.parametrize("what", sorted(RULES))
def test_no_tracked_file_says(what):
    pattern = re.compile(RULES[what])
    found = []
    for name in tracked():
        try:
            text = (ROOT / name).read_text()
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if pattern.search(line):
                found.append(f"{name}:{n}: {line.strip()[:120]}")
    assert not found, f"{len(found)} line(s) with {what}:\n" + "\n".join(found[:40])
