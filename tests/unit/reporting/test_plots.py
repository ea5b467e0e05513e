"""The pictures (eagleflow.reporting.plots) drawn from the figures they show: real PNG files of the size a page
takes, the same bytes for the same figures, and a failing picture that costs the stage nothing."""

from __future__ import annotations

from pathlib import Path

from eagleflow.reporting import plots

PNG = b"\x89PNG\r\n\x1a\n"


def _windows() -> list[dict]:
    rows = []
    for t in (0.0, 0.7):
        for c in (1, 4):
            rows.append({"variant": "baseline", "temperature": t, "concurrency": c, "output_tok_s": 100.0 * c})
            rows.append(
                {
                    "variant": "drafter",
                    "temperature": t,
                    "concurrency": c,
                    "output_tok_s": 180.0 * c - 50 * t,
                    "mean_acceptance_length": 3.1 - t,
                    "per_position_acceptance": [0.8, 0.7 - t / 2, 0.6 - t / 2],
                }
            )
    return rows


def _epochs() -> list[dict]:
    return [
        {"epoch": e, "train": {"loss": 3.0 / e}, "validation": {"loss": 3.2 / e, "acceptance_length": 2 + e / 4}}
        for e in (1, 2, 3)
    ]


def _size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")  # IHDR width, height


def test_each_picture_is_a_png_a_page_can_show(tmp_path):
    drawn = plots.draw(
        {
            "curves.png": lambda p: plots.training_curves(_epochs(), p),
            "acceptance.png": lambda p: plots.acceptance_by_position(_windows(), p),
            "speedup.png": lambda p: plots.speedup_grid(_windows(), p),
        },
        tmp_path,
    )
    assert drawn == {"curves": "curves.png", "acceptance": "acceptance.png", "speedup": "speedup.png"}
    for name in drawn.values():
        assert (tmp_path / name).read_bytes().startswith(PNG)
        w, h = _size(tmp_path / name)
        assert 400 <= w <= 2000 and 200 <= h <= 1000, (name, w, h)
    assert not list(tmp_path.glob(".*.tmp"))


def test_the_same_figures_draw_the_same_bytes(tmp_path):
    a = plots.speedup_grid(_windows(), tmp_path / "a.png")
    b = plots.speedup_grid(_windows(), tmp_path / "b.png")
    assert a.read_bytes() == b.read_bytes()


def test_nothing_to_show_draws_nothing_and_a_failure_is_only_a_warning(tmp_path, caplog):
    baseline_only = [w for w in _windows() if w["variant"] == "baseline"]
    drawn = plots.draw(
        {
            "acceptance.png": lambda p: plots.acceptance_by_position(baseline_only, p),
            "speedup.png": lambda p: plots.speedup_grid(baseline_only, p),
            "curves.png": lambda p: plots.training_curves([{"epoch": 1}], p),  # no losses: a KeyError inside
        },
        tmp_path,
    )
    assert drawn == {} and not list(tmp_path.iterdir())
    assert "could not draw curves.png" in caplog.text
