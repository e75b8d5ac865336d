"""bench/guard.py's decisions (issue 44): the figures it takes from the benches' real saved
results (tests/recordings/bench/: bench/scale_bench.py 32 3 and bench/train_bench.py 2 3
--profile, run on this project's machine 2026-11-28), and what it says when a figure moved."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REC = ROOT / "tests" / "recordings" / "bench"


@pytest.fixture(scope="module")
def guard():
    spec = importlib.util.spec_from_file_location("bench_guard", ROOT / "bench" / "guard.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def kept(value, tolerance=0.1):
    return {"value": value, "tolerance": tolerance, "measured": "2026-11-28", "commit": "abc1234"}


def test_scale_figures_are_ratios_to_the_floors_of_the_same_run(guard):
    got = guard.scale_figures(json.loads((REC / "scale-32.json").read_text()))
    # from the recording: bare true 1.471 s / 30.3 ms a node, probe 1.965 s, facts 1.944 s,
    # no-op provision 2.308 s / 47.8 ms a node
    assert got["scale32: no-op provision / bare Fabric probe (wall)"] == pytest.approx(
        1.175, rel=3e-3
    )
    assert got["scale32: invoke facts / bare Fabric probe (wall)"] == pytest.approx(0.989, rel=3e-3)
    assert got["scale32: no-op provision / bare Fabric true (wall)"] == pytest.approx(
        1.569, rel=3e-3
    )
    cpu = got["scale32: no-op provision / bare Fabric true (controller CPU)"]
    assert cpu == pytest.approx(1.578, rel=3e-3)


def test_train_figure_is_the_ratio_to_the_bare_command(guard):
    got = guard.train_figures(json.loads((REC / "train-2.json").read_text()))
    assert got == {
        "train2: invoke train / bare deepspeed (wall)": pytest.approx(15.095 / 13.682, rel=1e-3)
    }


def test_a_figure_beyond_its_tolerance_is_named_with_both_values_and_the_change(guard):
    lines = guard.compare({"a": kept(1.2), "b": kept(1.0), "c": kept(2.0)}, {"a": 1.5, "b": 0.8})
    assert lines[0] == ("MOVED (worse) a: 1.20x (2026-11-28) -> 1.50x (+25%, tolerance 10%)")
    assert lines[1].startswith("moved (better) b: 1.00x (2026-11-28) -> 0.80x (-20%")
    assert len(lines) == 2  # a kept figure this run did not measure is not reported


def test_within_tolerance_holds_and_a_new_figure_asks_to_be_recorded(guard):
    lines = guard.compare({"a": kept(1.2)}, {"a": 1.3, "n": 1.1})
    assert lines[0].startswith("held      a: 1.20x (2026-11-28) -> 1.30x (+8%, within 10%)")
    assert lines[1] == "new       n: 1.10x (no kept figure: run with --record)"


def test_the_kept_figures_name_what_the_guard_measures(guard):
    """bench/figures.json holds a value, a tolerance, a date and a commit for every figure the
    two quick benches produce (so the guard never runs without something to compare with)."""
    figures = json.loads((ROOT / "bench" / "figures.json").read_text())
    names = set(guard.scale_figures(json.loads((REC / "scale-32.json").read_text())))
    names |= set(guard.train_figures(json.loads((REC / "train-2.json").read_text())))
    assert set(figures) == names
    for f in figures.values():
        assert set(f) == {"value", "tolerance", "measured", "commit"}
        assert 0 < f["tolerance"] < 0.5 and f["value"] > 0


def test_head_commit_is_read_from_the_checkout(guard):
    got = guard.head_commit()
    assert len(got) == 7 and int(got, 16) >= 0


@pytest.mark.parametrize("argv", [["--only"], ["--only", "facts"]])
def test_a_bad_only_is_one_line_and_exit_2(guard, monkeypatch, capsys, argv):
    monkeypatch.setattr("sys.argv", ["guard.py", *argv])
    assert guard.main() == 2
    err = capsys.readouterr().err
    assert err == "guard: --only takes scale or train (bench/guard.py --only train)\n"
