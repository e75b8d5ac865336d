"""The rank contract of nodeside/rank.py (the wrapper every launcher starts around the script):
RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE (and MASTER_* under Slurm) from each launcher's
own variables, on real launchers' environments recorded on the lab (tests/recordings/
launcher-env/SOURCE.md); and --local_rank given exactly to the scripts that declare it."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeprep.nodeside import rank as rankmod

ENVS = Path(__file__).resolve().parents[1] / "recordings" / "launcher-env"


def _ranks(name: str) -> list[dict]:
    """Each recorded rank's launcher variables."""
    return [
        dict(kv.split("=", 1) for kv in line.split())
        for line in (ENVS / name).read_text().splitlines()
        if line.strip() and "=" in line
    ]


def _contract(env: dict) -> dict:
    return {**env, **rankmod.contract_env(env)}


@pytest.mark.parametrize(
    "name,want",
    [
        (
            "mpirun-openmpi-3ranks-2nodes.env",
            {("0", "3", "0", "2"), ("1", "3", "1", "2"), ("2", "3", "0", "1")},
        ),
        (
            "srun-3tasks-2nodes.env",
            {("0", "3", "0", "2"), ("1", "3", "1", "2"), ("2", "3", "0", "1")},
        ),
        ("torchrun-standalone-2.env", {("0", "2", "0", "2"), ("1", "2", "1", "2")}),
    ],
)
def test_every_launcher_gives_the_same_contract(name, want):
    got = [_contract(e) for e in _ranks(name)]
    assert {
        (g["RANK"], g["WORLD_SIZE"], g["LOCAL_RANK"], g["LOCAL_WORLD_SIZE"]) for g in got
    } == want
    if name.startswith("srun"):
        assert {g["MASTER_ADDR"] for g in got} == {"worker-0"} and {
            g["MASTER_PORT"] for g in got
        } == {"29500"}


def test_the_contract_never_overrides_what_a_launcher_set():
    env = {
        **_ranks("srun-3tasks-2nodes.env")[0],
        "RANK": "7",
        "MASTER_ADDR": "10.0.0.5",
        "MASTER_PORT": "29511",
    }
    add = rankmod.contract_env(env)
    assert "RANK" not in add and "MASTER_ADDR" not in add and "MASTER_PORT" not in add
    assert rankmod.contract_env(_ranks("torchrun-standalone-2.env")[0]) == {
        "NODEPREP_RESTART": "0"
    }  # torchrun set them all
    assert rankmod.contract_env(
        {"PMI_RANK": "3", "PMI_SIZE": "8", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "4"}
    ) == {  # MPICH / Intel MPI's names
        "RANK": "3",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "NODEPREP_RESTART": "0",
    }


def test_the_attempt_train_restarts_relaunched_reaches_the_script():
    """NODEPREP_RESTART from the launcher-forwarded PYTHON_NODEPREP_RESTART (0 on a first
    launch), added to the count torchrun's own agent keeps in TORCHELASTIC_RESTART_COUNT."""
    env = {**_ranks("torchrun-standalone-2.env")[0], "PYTHON_NODEPREP_RESTART": "2"}
    env["TORCHELASTIC_RESTART_COUNT"] = "1"
    add = rankmod.contract_env(env)
    assert add == {"NODEPREP_RESTART": "2", "TORCHELASTIC_RESTART_COUNT": "3"}


@pytest.mark.parametrize(
    "tasks,node,want",
    [
        ("2(x3),1", "2", 2),
        ("2(x3),1", "3", 1),
        ("4", "0", 4),
        ("2,1", "1", 1),
        ("garbage", "0", None),
        ("2", "5", None),
    ],
)
def test_slurm_tasks_on_this_node(tasks, node, want):
    assert rankmod.slurm_tasks_here(tasks, node) == want


@pytest.mark.parametrize(
    "nodelist,want",
    [
        ("worker-[0-1]", "worker-0"),
        ("gpu[007-009,012],cpu1", "gpu007"),
        ("node3,node4", "node3"),
        ("a1", "a1"),
        ("", None),
    ],
)
def test_first_host_of_a_slurm_node_list(nodelist, want):
    assert rankmod.first_host(nodelist) == want


def test_local_rank_argument_as_the_script_declares_it(tmp_path):
    plain = tmp_path / "plain.py"
    plain.write_text("import argparse\np = argparse.ArgumentParser()\np.add_argument('--steps')\n")
    ds = tmp_path / "ds.py"
    ds.write_text(
        "import argparse\np = argparse.ArgumentParser()\n"
        'p.add_argument(\n    "--local_rank", type=int, default=-1)\n'
    )
    dash = tmp_path / "dash.py"
    dash.write_text("parser.add_argument('--local-rank', type=int)\n")
    # DeepSpeed passes --local_rank=N: dropped for a script that does not take it, kept for one
    # that does
    assert rankmod.local_rank_args([str(plain), "--steps", "3", "--local_rank=1"], 1) == [
        str(plain),
        "--steps",
        "3",
    ]
    assert rankmod.local_rank_args([str(ds), "--local_rank=1", "--x"], 1) == [
        str(ds),
        "--x",
        "--local_rank=1",
    ]
    assert rankmod.local_rank_args([str(ds), "--local_rank", "1"], 1) == [
        str(ds),
        "--local_rank",
        "1",
    ]
    # torchrun, mpirun, srun pass none: given to a script that declares it, from the contract
    assert rankmod.local_rank_args([str(ds), "--x"], 0) == [str(ds), "--x", "--local_rank=0"]
    assert rankmod.local_rank_args([str(dash)], 2) == [str(dash), "--local_rank=2"]
    assert rankmod.local_rank_args([str(plain)], 0) == [str(plain)]


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM"])
def test_the_wrapper_ends_by_the_signal_that_ended_its_rank(tmp_path, sig):
    """A rank killed by a signal: its wrapper ends by the same signal (what the launcher sees),
    SIGKILL too, whose disposition cannot be set (the wrapper once died of EINVAL in a clean-
    clone rehearsal under mpirun, with a traceback in the job's output)."""
    import os
    import signal
    import subprocess
    import sys

    script = tmp_path / "die.py"
    script.write_text(f"import os, signal\nos.kill(os.getpid(), signal.{sig})\n")
    env = dict(
        os.environ,
        HOME=str(tmp_path),
        PYTHON_NODEPREP_JOB="j1",
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
    )
    r = subprocess.run(
        [sys.executable, rankmod.__file__, str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == -getattr(signal, sig) and "Traceback" not in r.stderr, r.stderr


def _wrapped(tmp_path, body: str):
    """Run BODY as a rank's script under the wrapper; (completed process, exit record, stack
    text)."""
    import json
    import os
    import subprocess
    import sys

    script = tmp_path / "s.py"
    script.write_text(body)
    env = dict(
        os.environ,
        HOME=str(tmp_path),
        PYTHON_NODEPREP_JOB="j1",
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
    )
    r = subprocess.run(
        [sys.executable, rankmod.__file__, str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    run = tmp_path / ".nodeprep" / "runs" / "j1"
    record = json.loads((run / "ranks" / "0.1.exit").read_text())
    stack = run / "rank-0.stack"
    return r, record, stack.read_text() if stack.exists() else ""


# An object whose finalizer aborts once the interpreter clears its modules: after atexit, as
# torch's gloo threads abort in a rank's teardown ("terminate called without an active exception")
TEARDOWN_ABORT = """import atexit, os, sys, time, types
class Aborts:
    def __del__(self):
        os.abort()
holder = types.ModuleType("holder")
holder.obj = Aborts()
sys.modules["holder"] = holder
atexit.register(lambda: open(os.path.join(os.environ["HOME"], "handler"), "w").write(repr(time.time())))
print("work done", flush=True)
"""  # noqa: E501 (a program text, kept as written)


def test_a_crash_in_the_interpreters_teardown_after_the_script_ended_is_recorded_not_failed(
    tmp_path,
):
    import signal

    r, record, _ = _wrapped(tmp_path, TEARDOWN_ABORT)
    assert r.returncode == 0, r.stderr
    assert record["rc"] == 0 and record["teardown_rc"] == -signal.SIGABRT, record
    # the done stamp follows the script's own exit handler
    assert record["done_at"] >= float((tmp_path / "handler").read_text()), record


@pytest.mark.parametrize(
    "body,rc",
    [
        ("import os\nos.abort()\n", "abort"),  # in the script
        ("import sys\nsys.exit(3)\n", 3),
        ("import atexit, os\natexit.register(os.abort)\n", "abort"),  # in its exit handler
        # a child the script forked ends through its exit handlers; the rank itself then aborts
        (
            "import os, sys, time\nif os.fork() == 0:\n    sys.exit(0)\nos.wait()\nos.abort()\n",
            "abort",
        ),
        # failed, then its teardown crashed: the crash stays (with the script's status beside it)
        (TEARDOWN_ABORT.replace('print("work done"', 'raise SystemExit(2)\nprint("x"'), "abort"),
    ],
)
def test_a_rank_that_fails_before_its_exit_handlers_ended_fails_as_before(tmp_path, body, rc):
    import signal

    r, record, _ = _wrapped(tmp_path, body)
    want = -signal.SIGABRT if rc == "abort" else rc
    assert r.returncode == want and record["rc"] == want and "teardown_rc" not in record, (
        r.stderr,
        record,
    )
    assert record.get("script_rc") == (
        2 if "SystemExit(2)" in body else (3 if rc == 3 else None)
    ), record


def test_a_fatal_signal_dumps_where_every_thread_was(tmp_path):
    from nodeprep.ops.train import tracebacks

    body = "import os\n\ndef finish():\n    os.abort()\n\ndef main():\n    finish()\n\nmain()\n"
    r, record, stack = _wrapped(tmp_path, body)
    assert "Fatal Python error: Aborted" in stack, stack
    main = tracebacks.main_thread(tracebacks.parse(stack)[-1])
    assert [(f.func, f.line) for f in main.frames[:3]] == [
        ("finish", 4),
        ("main", 7),
        ("<module>", 9),
    ], stack
