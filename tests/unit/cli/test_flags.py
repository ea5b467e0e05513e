"""The operator's commands take their flags whole: an abbreviation is refused (exit 2) rather than read as the
flag it begins, so a command written today keeps its meaning when a longer flag is added later."""

from __future__ import annotations

import pytest

from cli import plan, status, trigger
from flows.params import main_cli


@pytest.mark.parametrize(
    ("main", "argv"),
    [
        (trigger.main, ["benchmark", "configs/demo.yaml", "--temperature", "[0.0]"]),
        (plan.main, ["configs/demo.yaml", "--host-fact", "x.json"]),
        (status.main, ["configs/demo.yaml", "--lim", "1"]),
        # `python -m flows.benchmark CONFIG --drafter DIR`; the flow itself is never reached
        (
            lambda argv: main_cli(None, None, extra_args={"--drafter": "a drafter"}, argv=argv),
            ["c.yaml", "--draft", "d"],
        ),
    ],
)
def test_an_abbreviated_flag_is_refused(main, argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert f"unrecognized arguments: {argv[-2]}" in capsys.readouterr().err
