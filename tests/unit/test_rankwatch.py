"""The decisions of the rank watch (ops/train/rankwatch.py) from recorded watcher ticks: which event
stops the job, which is its root cause, what is a consequence, one prefix per line."""

from __future__ import annotations

import signal
import time

from nodeprep.commands.train.runspec import RunSpec
from nodeprep.commands.train.supervise import launch_script, watch_script
from nodeprep.engine import facts as factmod
from nodeprep.ops.train.rankwatch import RankWatch, describe_rc

LAYOUT = [["worker-0", 2], ["worker-1", 2]]


def spec(layout=LAYOUT) -> RunSpec:
    return RunSpec(
        "J1",
        "deepspeed",
        "2 node(s)",
        inventory=None,
        limit=None,
        nodes=["worker-0", "worker-1"],
        commands={"worker-0": ["worker-0", "true"]},
        watchers={},
        layout=layout,
    )


def watch(restarts=False, hang=None, layout=LAYOUT) -> RankWatch:
    return RankWatch(
        ["worker-0", "worker-1"],
        ["worker-0"],
        spec(layout).label_of,
        names=["worker-0", "worker-1"],
        restarts=restarts,
        hang_timeout=hang,
    )


def start(rank, t=100.0, attempt=1, node=None):
    return {
        "k": "start",
        "rank": rank,
        "attempt": attempt,
        "start": t,
        "pid": 10 + rank,
        "node": node,
    }


def end(rank, rc, t, attempt=1, oom=None):
    return {"k": "exit", "rank": rank, "attempt": attempt, "rc": rc, "end": t, "oom": oom}


def test_layout_maps_global_ranks_to_nodes_in_hostfile_order():
    s = spec()
    assert [s.label_of(r, {}) for r in range(4)] == ["worker-0", "worker-0", "worker-1", "worker-1"]
    # torchrun: the rendezvous orders the nodes, each rank says its node
    assert spec(None).label_of(3, {"node": "worker-0"}) == "worker-0"


def test_first_bad_exit_is_the_root_cause_and_later_ones_are_consequences():
    w = watch()
    w.feed("worker-0", {"ev": [start(0), start(1)]})
    w.feed("worker-1", {"ev": [start(2), start(3)]})
    assert w.failures == [] and len(w.alive()) == 4
    # worker-0 reports a consequence (gloo error) that happened AFTER worker-1's rank died,
    # and its tick arrives first: the nodes' clocks decide, not the arrival order
    w.feed("worker-0", {"ev": [end(0, 1, 105.0)]})
    w.feed("worker-1", {"ev": [end(3, 1, 104.2)]})
    root = w.root_cause()
    assert root.who == "worker-1 r3" and root.what == "exited with status 1" and root.rank == 3
    assert [f.who for f in w.failures if f is not root] == ["worker-0 r0"]


def test_the_moment_a_script_failed_beats_the_moment_its_exit_was_seen():
    """The lab's case (tests/integration/test_user_script.py, mpirun): rank 1's script calls
    sys.exit(1) at 100.0, its interpreter takes 0.3 s to tear down; rank 0 aborts on the closed
    connection at 100.2, before rank 1's exit is seen at 100.3: rank 1 is still the cause."""
    w = watch()
    w.feed("worker-0", {"ev": [start(0), start(1)]})
    w.feed(
        "worker-0", {"ev": [dict(end(0, -6, 100.25), failed_at=100.2)]}
    )  # SIGABRT after a RuntimeError
    w.feed("worker-0", {"ev": [dict(end(1, 1, 100.3), failed_at=100.0)]})
    assert w.root_cause().who == "worker-0 r1"


def line(rank, text):
    return {"k": "line", "src": f"r{rank}.err", "text": text}


GLOO_RESET = (
    "[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
    "pair.cc:537] Read error [10.199.0.11]:3242: Connection reset by peer."
)


def test_a_rank_that_lost_its_peer_yields_to_the_peer_that_was_killed():
    """Seen in a clean-clone CI run (mpirun, 2026-11-27): rank 1 SIGKILLed itself; the kernel
    closed its sockets before its wrapper saw it die, and rank 0's gloo read failed 10 ms
    earlier by the clock. Rank 0's last lines say its peer went away: rank 1 is the cause."""
    w = watch()
    w.feed("worker-0", {"ev": [start(0)]})
    w.feed("worker-1", {"ev": [start(2)]})
    w.feed(
        "worker-0",
        {"ev": [line(0, GLOO_RESET), dict(end(0, -6, 100.05), failed_at=100.00, script_rc=1)]},
    )
    w.feed("worker-1", {"ev": [end(2, -signal.SIGKILL, 100.01)]})
    root = w.root_cause()
    assert root.who == "worker-1 r2" and root.what == "was killed by SIGKILL"
    # without the peer's error in its lines, the clock decides as before
    w2 = watch()
    w2.feed("worker-0", {"ev": [start(0)]})
    w2.feed("worker-1", {"ev": [start(2)]})
    w2.feed(
        "worker-0",
        {"ev": [line(0, "ValueError: bad batch"), dict(end(0, 1, 100.05), failed_at=100.0)]},
    )
    w2.feed("worker-1", {"ev": [end(2, -signal.SIGKILL, 100.01)]})
    assert w2.root_cause().who == "worker-0 r0"


def test_a_lost_peer_far_earlier_than_any_other_failure_stays_the_root_cause():
    w = watch()
    w.feed("worker-0", {"ev": [start(0)]})
    w.feed("worker-1", {"ev": [start(2)]})
    w.feed("worker-0", {"ev": [line(0, GLOO_RESET), dict(end(0, 1, 100.05), failed_at=100.0)]})
    w.feed("worker-1", {"ev": [end(2, -signal.SIGKILL, 130.0)]})  # far later: not its cause
    assert w.root_cause().who == "worker-0 r0"


def test_a_script_that_exited_1_then_got_the_launchers_term_says_both():
    """srun's --kill-on-bad-exit TERMs the failing task too while it tears down (seen on the
    lab's Slurm): its status is the script's own, the signal said after it."""
    w = watch()
    w.feed("worker-0", {"ev": [start(0), start(1)]})
    w.feed("worker-0", {"ev": [dict(end(1, -15, 100.4), failed_at=100.0, script_rc=1)]})
    w.feed("worker-0", {"ev": [dict(end(0, -6, 100.3), failed_at=100.2, script_rc=1)]})
    root = w.root_cause()
    assert (
        root.who == "worker-0 r1"
        and root.what == "exited with status 1 (then was killed by SIGTERM as it shut down)"
    )


def test_a_script_that_failed_before_the_stop_stays_the_failure_when_its_term_comes_after():
    """Seen in a lab rehearsal under srun (2026-11-27): rank 1 exited 1, rank 0 lost its gloo
    peer and its record arrived first, nodeprep began its stop, and then rank 1's record came:
    ended by srun's TERM in its teardown, after the stop began. The script's own failure came
    first: it is the root cause, not a rank nodeprep stopped."""
    w = watch()
    w.feed("worker-0", {"ev": [start(0), start(1)]})
    now = time.time()
    w.feed(
        "worker-0",
        {
            "ev": [
                line(0, GLOO_RESET),
                dict(end(0, -6, now - 0.25), failed_at=now - 0.3, script_rc=1),
            ]
        },
    )
    w.stopping()
    w.feed("worker-0", {"ev": [dict(end(1, -15, now + 0.2), failed_at=now - 0.5, script_rc=1)]})
    root = w.root_cause()
    assert (
        root.who == "worker-0 r1"
        and root.what == "exited with status 1 (then was killed by SIGTERM as it shut down)"
    )
    assert w.ranks[(1, 1)].how == "failed"
    # a script that failed only after the stop began (its peers were being stopped) was stopped
    w2 = watch()
    w2.feed("worker-0", {"ev": [start(0), start(1), end(0, 1, now - 0.1)]})
    w2.stopping()
    w2.feed("worker-0", {"ev": [dict(end(1, -15, now + 0.3), failed_at=now + 0.2, script_rc=1)]})
    assert w2.ranks[(1, 1)].how == "stopped" and w2.root_cause().who == "worker-0 r0"


def test_ranks_ended_by_nodeprep_are_stopped_not_failed():
    w = watch()
    w.feed("worker-0", {"ev": [start(0), start(1)]})
    w.feed("worker-1", {"ev": [start(2), start(3), end(2, -signal.SIGKILL, 101.0)]})
    w.stopping()
    now = time.time()
    w.feed(
        "worker-0", {"ev": [end(0, -signal.SIGTERM, now + 0.2), end(1, -signal.SIGTERM, now + 0.3)]}
    )
    assert len(w.failures) == 1 and w.failures[0].what == "was killed by SIGKILL"
    assert {r.name: r.how for r in w.ranks.values()} == {
        "worker-0 r0": "stopped",
        "worker-0 r1": "stopped",
        "worker-1 r2": "failed",
        "worker-1 r3": "running",
    }


def test_oom_kill_and_vanished_wrapper_are_named():
    assert describe_rc(-9, oom=True) == "was killed by the kernel's OOM killer (SIGKILL)"
    assert describe_rc(-15) == "was killed by SIGTERM" and describe_rc(3) == "exited with status 3"
    w = watch()
    w.feed("worker-1", {"ev": [start(2), {"k": "vanished", "rank": 2, "attempt": 1, "end": 103.0}]})
    assert w.root_cause().who == "worker-1 r2" and "vanished" in w.root_cause().what


def test_torchrun_restarts_are_not_failures_but_the_agent_giving_up_is():
    w = watch(restarts=True, layout=None)
    w.feed("worker-1", {"ev": [start(1, node="worker-1"), end(1, -9, 103.0)]})
    w.feed("worker-1", {"ev": [start(1, attempt=2, node="worker-1")]})
    assert w.failures == [] and {r.how for r in w.ranks.values()} == {"restarted", "running"}
    w.feed("worker-1", {"ev": [{"k": "launcher", "label": "0", "rc": 1, "end": 120.0}]})
    assert w.root_cause().kind == "launcher"


def test_a_rank_failure_beats_the_launcher_failure_it_causes():
    w = watch()
    w.feed("worker-1", {"ev": [start(2), end(2, 1, 110.0)]})
    w.feed("worker-0", {"ev": [{"k": "launcher", "label": "0", "rc": 1, "end": 109.0}]})
    assert w.root_cause().who == "worker-1 r2"


def test_node_loss_and_silence():
    w = watch()
    w.node_timeout = 0.05
    w.feed("worker-0", {"ev": []})
    time.sleep(0.1)
    assert set(w.silent()) == {"worker-0", "worker-1"}
    w.lost("worker-1", "its ssh session ended")
    assert w.root_cause().line == "worker-1 stopped answering (its ssh session ended)"
    w.lost("worker-1", "again")
    assert len(w.failures) == 1


def test_done_only_when_every_launcher_ended_cleanly():
    w = watch()
    w.feed("worker-0", {"ev": [start(0), end(0, 0, 101.0)]})
    assert not w.done()
    w.feed("worker-0", {"ev": [{"k": "launcher", "label": "0", "rc": 0}]})
    assert w.done() and w.root_cause() is None


def test_one_prefix_per_line_for_pdsh_relayed_and_rank_lines():
    w = watch()
    w.feed("worker-1", {"ev": [start(2)]})
    lines = w.feed(
        "worker-0",
        {
            "ev": [
                {"k": "line", "src": "L:0", "text": "worker-1: [INFO] launch.py: nnodes=2"},
                {"k": "line", "src": "L:0", "text": "plain launcher line"},
                {"k": "line", "src": "L:0", "text": "notanode: x"},
            ]
        },
    )
    lines += w.feed(
        "worker-1",
        {
            "ev": [
                {"k": "line", "src": "r2.out", "text": "rank 2 step 1"},
                {"k": "line", "src": "r2.stack", "text": '  File "x.py", line 3'},
            ]
        },
    )
    assert lines == [
        ("worker-1", "launcher", "[INFO] launch.py: nnodes=2"),
        ("worker-0", "launcher", "plain launcher line"),
        ("worker-0", "launcher", "notanode: x"),
        ("worker-1 r2", "out", "rank 2 step 1"),
        ("worker-1 r2", "stack", '  File "x.py", line 3'),
    ]
    assert w.stacks[2] == ['  File "x.py", line 3']


def test_hang_needs_silence_from_every_rank():
    w = watch(hang=0.2)
    w.feed("worker-0", {"ev": [start(0)]})
    assert not w.hung()
    time.sleep(0.15)
    w.feed("worker-0", {"ev": [{"k": "beat", "rank": 0, "t": 1.0}]})
    time.sleep(0.1)
    assert not w.hung()
    time.sleep(0.15)
    assert w.hung()
    assert not watch(hang=None).hung()


def test_stop_seconds_from_root_cause_to_last_rank_gone():
    w = watch()
    w.feed("worker-1", {"ev": [start(2), start(3), end(2, 1, 100.0)]})
    w.stopping()
    w.feed("worker-1", {"ev": [end(3, -15, 102.5)]})
    assert w.stop_seconds() == 2.5


def test_node_scripts_quote_and_tag():
    s = launch_script("J1", 0, "cd /x && echo 'a b'")
    assert "setsid" in s and "PYTHON_NODEPREP_JOB=J1" in s and "env -u NODEPREP_RUN" in s
    assert "cd /x" not in s  # the command travels base64-encoded, never re-parsed
    w = watch_script("J1", "/home/u/venv bin/python", "/home/u/.nodeprep/agent", [0, 2])
    assert "'/home/u/venv bin/python'" in w and "--launcher 0 --launcher 2" in w


def test_srun_task_labels_are_taken_off_launcher_lines():
    w = RankWatch(["worker-0"], ["worker-0"], spec().label_of, names=["worker-0"], task_labels=True)
    lines = w.feed(
        "worker-0", {"ev": [{"k": "line", "src": "L:0", "text": "1: srun: error: task 1 exited"}]}
    )
    assert lines == [("worker-0", "launcher", "srun: error: task 1 exited")]


def test_job_process_and_gpu_app_parsers_on_real_formats():
    from nodeprep.ops.train import processes

    procs = factmod.JOB_PROCESSES.parse(
        "4242\t20261123-abc\t/v/bin/python -u rank.py ddp.py \nbad line\n77\tother\tsleep 300\n", 0
    )
    assert [p["pid"] for p in procs] == [4242, 77]
    assert processes.stale(procs, "20261123-abc") == {
        "other": [{"pid": 77, "job": "other", "args": "sleep 300"}]
    }
    # nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader
    apps = factmod.GPU_APPS.parse("12345, /usr/bin/python3, 40536 MiB\n678, python, 512 MiB\n", 0)
    assert apps == [
        {"pid": 12345, "name": "/usr/bin/python3", "memory": "40536 MiB"},
        {"pid": 678, "name": "python", "memory": "512 MiB"},
    ]
    assert factmod.GPU_APPS.parse("", 0) == []


def test_a_plain_exit_status_is_a_failure_even_when_it_arrives_after_the_stop():
    """srun's --kill-on-bad-exit (or the launcher) may stop the others first; the rank that
    exited 1 BEFORE is still the root cause, whatever order the records arrive in."""
    w = watch()
    w.feed("worker-0", {"ev": [start(0), start(1)]})
    w.feed("worker-1", {"ev": [start(2), start(3)]})
    now = time.time()
    w.feed("worker-0", {"ev": [end(0, -signal.SIGTERM, now - 0.3)]})  # srun's kill, seen first
    w.stopping()
    w.feed("worker-1", {"ev": [end(3, 1, now - 0.4), end(2, -signal.SIGTERM, now + 0.1)]})
    assert w.root_cause().who == "worker-1 r3" and w.root_cause().what == "exited with status 1"
    assert w.ranks[(2, 1)].how == "stopped" and w.ranks[(0, 1)].how == "failed"


def test_a_fatal_signal_is_described_where_the_rank_was(tmp_path):
    """A rank's script aborts inside a library call (here a stand-in laid out as torch's
    distributed_c10d.py under site-packages): the wrapper's faulthandler dump (real, written by
    rank.py's child) names the library call and the script's line that made it."""
    import json
    import os
    import subprocess
    import sys

    from nodeprep.nodeside import rank as rankmod

    lib = tmp_path / "site-packages" / "torch" / "distributed"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text("")
    (tmp_path / "site-packages" / "torch" / "__init__.py").write_text("")
    (lib / "distributed_c10d.py").write_text(
        "import os\n\ndef destroy_process_group():\n    os.abort()\n"
    )
    script = tmp_path / "train.py"
    script.write_text(
        "from torch.distributed import distributed_c10d as c10d\n\ndef main():\n"
        "    c10d.destroy_process_group()\n\nmain()\n"
    )
    env = dict(
        os.environ,
        HOME=str(tmp_path),
        PYTHON_NODEPREP_JOB="j1",
        RANK="1",
        WORLD_SIZE="2",
        LOCAL_RANK="0",
        PYTHONPATH=str(tmp_path / "site-packages"),
    )
    subprocess.run(
        [sys.executable, rankmod.__file__, str(script)], env=env, capture_output=True, timeout=60
    )
    run = tmp_path / ".nodeprep" / "runs" / "j1"
    rec = json.loads((run / "ranks" / "1.1.exit").read_text())
    w = watch()
    w.feed("worker-0", {"ev": [start(0), start(1)]})
    w.feed(
        "worker-0",
        {
            "ev": [
                {"k": "line", "src": "r1.stack", "text": t}
                for t in (run / "rank-1.stack").read_text().splitlines()
            ]
        },
    )
    w.feed("worker-0", {"ev": [dict(rec, k="exit")]})
    root = w.root_cause()
    assert w.described(root) == (
        "worker-0 r1 was killed by SIGABRT in torch (destroy_process_group) "
        "called at train.py:4 in main"
    ), w.stacks
    # without a dump (or for another kind of end) the line stays as it was
    w2 = watch()
    w2.feed("worker-0", {"ev": [start(0), end(0, -signal.SIGABRT, 101.0)]})
    assert w2.described(w2.root_cause()) == "worker-0 r0 was killed by SIGABRT"


def test_a_teardown_crash_of_a_finished_rank_is_a_warning_not_a_failure():
    w = watch()
    w.feed("worker-0", {"ev": [start(0), start(1)]})
    w.feed(
        "worker-0",
        {
            "ev": [
                dict(end(1, 0, 101.25), teardown_rc=-signal.SIGABRT, done_at=101.2),
                end(0, 0, 101.3),
            ]
        },
    )
    assert w.failures == [] and w.root_cause() is None
    assert w.warnings == [
        "worker-0 r1 was killed by SIGABRT in the interpreter's teardown 0.05s after its script "
        "and exit handlers had ended (counted as done: nothing of the script was cut short)"
    ]


def test_a_slow_node_gets_a_silence_limit_at_its_own_pace(monkeypatch):
    """Each node's silence limit follows the pace its watcher ticks at (what the node reports,
    never a guess from its kind): a native node's 0.25 s ticks keep the 8 s limit; a node that
    ticks every 1.2 s (an emulated aarch64 node's watcher on a busy controller) gets 20 of its
    intervals; the first tick (the watcher starting up) sets no pace."""
    from nodeprep.ops.train import rankwatch

    now = [1000.0]
    monkeypatch.setattr(rankwatch.time, "monotonic", lambda: now[0])
    w = watch()
    now[0] += 6.0  # both watchers start up slowly
    w.feed("worker-0", {"ev": []})
    w.feed("worker-1", {"ev": []})
    for _ in range(30):
        now[0] += 0.25
        w.feed("worker-0", {"ev": []})
        if _ % 5 == 4:
            w.feed("worker-1", {"ev": []})  # every 1.25 s
    assert w.silence_limit("worker-0") == 8.0
    assert abs(w.silence_limit("worker-1") - 25.0) < 0.5, w.pace
    now[0] += 9.0  # 9 s of silence from both
    assert w.silent() == ["worker-0"]
    now[0] += 17.0
    assert w.silent() == ["worker-0", "worker-1"]


def test_the_train_summary_says_finished_or_failed_once_with_the_warnings(capsys):
    from nodeprep.cli import render
    from nodeprep.commands.train.run import TrainResult
    from nodeprep.commands.train.runspec import Outcome

    warn = "worker-0 r1 was killed by SIGABRT in the interpreter's teardown 0.05s after ..."
    render.train(TrainResult("J1", "2 node(s)", Outcome(warnings=[warn], checked=2), run_dir="/r"))
    err = capsys.readouterr().err
    assert err.splitlines()[:2] == ["train: job J1 finished on 2 node(s)", f"  warning: {warn}"], (
        err
    )
    assert "FAILED" not in err
    render.train(
        TrainResult(
            "J1",
            "2 node(s)",
            Outcome(
                failure="worker-1 r1 exited with status 1",
                state="failed",
                warnings=[warn],
                checked=2,
            ),
            run_dir="/r",
        )
    )
    err = capsys.readouterr().err
    assert (
        err.startswith("train: job J1 FAILED: worker-1 r1 exited with status 1\n")
        and f"  warning: {warn}" in err
    )
    assert "finished" not in err
