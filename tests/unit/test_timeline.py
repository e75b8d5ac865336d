"""A training job's timeline (cli/timeline.py) drawn from its attempts as train --restarts
records them (ops/train/rundir.attempts): the rows and bars as data, then a real PNG through
matplotlib, and the one-attempt record rundir makes of a run without attempts.json."""

from __future__ import annotations

import json
import struct

from nodeprep.cli import timeline
from nodeprep.ops.train import rundir

NODE_LOST = {"klass": "node", "node": "worker-2", "why": "worker-2 silent 15 s", "line": "node"}
ATTEMPTS = [
    {
        "attempt": 1,
        "job_id": "j1",
        "nodes": ["worker-0", "worker-1", "worker-2"],
        "cause": NODE_LOST,
        "quarantined": {"worker-2": "node on worker-2"},
        "spares": {"worker-9": 21.0},
        "started": 1000.0,
        "ended": 1030.0,
    },
    {
        "attempt": 2,
        "job_id": "j2",
        "nodes": ["worker-0", "worker-1", "worker-9"],
        "cause": None,
        "quarantined": {},
        "spares": {},
        "started": 1055.0,
        "ended": 1100.0,
    },
]


def test_rows_and_bars_follow_the_attempts():
    assert timeline.rows(ATTEMPTS) == ["worker-0", "worker-1", "worker-2", "worker-9"]
    got = timeline.bars(ATTEMPTS)
    assert ("worker-2", 0.0, 30.0, "failed", 1) in got
    assert ("worker-9", 55.0, 45.0, "finished", 2) in got
    assert not any(b[0] == "worker-2" and b[4] == 2 for b in got)  # quarantined: not relaunched
    running = [{**ATTEMPTS[1], "ended": None, "started": 1000.0}]
    assert timeline.bars(running, now=1010.0)[0][1:4] == (0.0, 10.0, "running")


def test_the_timeline_is_a_png_of_a_size_that_fits_its_rows(tmp_path):
    path = tmp_path / "t.png"
    timeline.png(ATTEMPTS, str(path), "job j1: 2 attempt(s)")
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", head[16:24])
    assert width == 9 * 120 and height == int((1.2 + 0.45 * 4) * 120), (width, height)


def test_a_run_without_restarts_is_its_one_attempt(tmp_path):
    (tmp_path / "job.json").write_text(json.dumps({"job_id": "j7", "nodes": ["a", "b"]}))
    state = {"state": "failed", "started": 5.0, "updated": 9.0, "outcome": {"cause": NODE_LOST}}
    (tmp_path / "state.json").write_text(json.dumps(state))
    one = rundir.attempts(tmp_path)
    assert [(a["job_id"], a["nodes"], a["started"], a["ended"]) for a in one] == [
        ("j7", ["a", "b"], 5.0, 9.0)
    ]
    assert one[0]["cause"] == NODE_LOST
    (tmp_path / "attempts.json").write_text(json.dumps(ATTEMPTS))
    assert rundir.attempts(tmp_path) == ATTEMPTS


def test_a_png_path_that_cannot_be_written_is_refused_before_anything_runs(tmp_path, capsys):
    from nodeprep import cli
    from nodeprep.commands.options import RunsOptions
    from nodeprep.settings import Settings

    settings = Settings(state_dir=str(tmp_path / "state"))
    for bad in (str(tmp_path / "nope" / "t.png"), str(tmp_path / "t.txt")):
        assert cli.train_status(RunsOptions(png=bad), settings) == 2
        err = capsys.readouterr().err
        assert (
            err.startswith(f"error: --png {bad}: expected a .png file") and "Traceback" not in err
        )
