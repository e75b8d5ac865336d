"""nodeside/watch.py, the real script in a real process: between its ticks it wakes when a rank
record appears or the controller says stop, so the controller hears of an exit (and the watch
ends) at once rather than at the next tick. The tick here is 60 s: an event that arrives before
it proves the wake-up, without timing anything."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

from nodeprep import nodeside
from nodeprep.nodeside.rank import machine_key

JOB = "20261128000000-abcdef"


def _watch(home):
    env = dict(os.environ, HOME=str(home), PYTHONPATH=str(nodeside.WATCH.parent))
    proc = subprocess.Popen(
        [sys.executable, "-u", str(nodeside.WATCH), JOB, "--interval", "60", "--launcher", "0"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    ticks = []
    got = threading.Event()

    def read():
        for line in proc.stdout:
            ticks.append(json.loads(line))
            got.set()

    threading.Thread(target=read, daemon=True).start()
    return proc, ticks, got


def _wait_for(got, ticks, n):
    while len(ticks) < n:
        assert got.wait(30), f"no tick {n} within 30 s of a 60 s interval: {ticks}"
        got.clear()


def test_a_rank_record_a_launcher_end_and_the_stop_each_wake_the_watch(tmp_path):
    run = tmp_path / ".nodeprep" / "runs" / JOB
    (run / "ranks").mkdir(parents=True)
    proc, ticks, got = _watch(tmp_path)
    try:
        _wait_for(got, ticks, 1)  # the first tick, at once
        rec = {"rank": 0, "attempt": 0, "pid": os.getpid(), "machine": machine_key()}
        tmp = run / "ranks" / ".tmp"
        tmp.write_text(json.dumps(rec))
        os.replace(tmp, run / "ranks" / "0.0.start")  # as rank.py writes its records
        _wait_for(got, ticks, 2)
        assert [e["k"] for e in ticks[1]["ev"]] == ["start"]
        (run / "launcher-0.rc").write_text("0\n")
        _wait_for(got, ticks, 3)
        assert [(e["k"], e["rc"]) for e in ticks[2]["ev"]] == [("launcher", 0)]
        (run / "watch.stop").touch()
        assert proc.wait(timeout=30) == 0
        assert ticks[-1]["end"] is True
    finally:
        proc.kill()
        proc.wait()
