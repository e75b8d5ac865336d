"""The Slurm transport's pure parts (engine/transports/slurm.py) and its batching
(engine/transports/slurmrun.py): the bundle is run for real by /bin/sh once per stand-in node
(SLURMD_NODENAME set as slurmd sets it) and its lines labelled as `srun --label` labels them, so the
fencing, the dedupe, the per-node answers, a forged marker and a task that died are checked end to
end without a Slurm. The real srun/sbcast path is tests/integration/test_slurm_transport.py."""

from __future__ import annotations

import subprocess
import threading
import time
from types import SimpleNamespace

import pytest

from nodeprep.engine.session import CmdResult
from nodeprep.engine.transports import slurm, slurmrun
from nodeprep.errors import InputError

TOKEN = "0123456789abcdef"


def srun_like(bundle: str, nodes: list[str], tmp_path, drop: str | None = None) -> str:
    """What the head prints: each node's task output under its task label (srun --label),
    interleaved line by line, then the head's own fenced lines."""
    path = tmp_path / "bundle.sh"
    path.write_text(bundle)
    streams = []
    for i, n in enumerate(nodes):
        out = subprocess.run(
            ["/bin/sh", str(path)],
            env={"SLURMD_NODENAME": n, "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
        lines = out.splitlines()
        if n == drop:  # the task died before its last markers
            lines = lines[:1]
        streams.append([f"{i}: {ln}" for ln in lines])
    merged = []
    for k in range(max(len(s) for s in streams)):  # srun interleaves whole lines
        merged += [s[k] for s in streams if k < len(s)]
    err = f"@@{TOKEN}:err@@ srun: error: {drop}: task 1: Killed" if drop else ""
    return "\n".join(merged + [f"@@{TOKEN}:head=0@@", err]) + "\n"


def test_each_node_gets_its_own_answer_with_its_own_tokens(tmp_path):
    probe = (
        "echo '@@%s:x@@'; echo \"$SLURMD_NODENAME\"\n"
        '[ "$SLURMD_NODENAME" = n1 ] && { echo warn >&2; exit 3; }; exit 0\n'
    )
    scripts = {"n1": probe % "aaaaaaaaaaaa", "n2": probe % "bbbbbbbbbbbb"}
    b = slurm.bundle([(n, s, 10) for n, s in scripts.items()], TOKEN)
    assert b.count("() { cat <<") == 1  # the same script modulo its token: sent once
    out = slurm.parse(srun_like(b, ["n1", "n2"], tmp_path), TOKEN, ["n1", "n2"], {})
    assert out["n1"].rc == 3 and out["n1"].stdout == "@@aaaaaaaaaaaa:x@@\nn1\n"
    assert out["n1"].stderr == "warn\n"
    assert out["n2"].rc == 0 and out["n2"].stdout == "@@bbbbbbbbbbbb:x@@\nn2\n"


def test_what_crosses_the_wire_grows_by_a_line_per_node():
    probe = "echo '@@%s:x@@'\n" + "echo padding-of-a-real-probe\n" * 200
    size = {
        n: len(slurm.bundle([(f"node{i}", probe % f"{i:012x}", 60) for i in range(n)], TOKEN))
        for n in (10, 1000)
    }
    per_node = (size[1000] - size[10]) / 990
    assert per_node < 80, per_node  # a table line, not a copy of the script


def test_distinct_scripts_are_all_sent_and_each_node_runs_its_own(tmp_path):
    b = slurm.bundle([("a", "echo A\n", 10), ("b", "echo B\n", 10), ("c", "echo A\n", 10)], TOKEN)
    assert b.count("() { cat <<") == 2
    out = slurm.parse(srun_like(b, ["a", "b", "c"], tmp_path), TOKEN, ["a", "b", "c"], {})
    assert [out[n].stdout for n in "abc"] == ["A\n", "B\n", "A\n"]


def test_a_node_cannot_forge_markers_or_another_nodes_answer(tmp_path):
    forge = (
        f"echo '@@{TOKEN}:rc=0:0@@'; echo '@@{TOKEN}:e@@'; echo '@@{TOKEN}:node=n2@@'; "
        f"echo '1: @@{TOKEN}:node=n2@@'; exit 7\n"
    )
    b = slurm.bundle([("n1", forge, 10), ("n2", "echo fine\n", 10)], TOKEN)
    out = slurm.parse(srun_like(b, ["n1", "n2"], tmp_path), TOKEN, ["n1", "n2"], {})
    assert out["n1"].rc == 7 and "node=n2" in out["n1"].stdout
    assert out["n2"].rc == 0 and out["n2"].stdout == "fine\n"


def test_a_task_that_died_is_its_nodes_failure_only(tmp_path):
    b = slurm.bundle([("n1", "echo ok\n", 10), ("n2", "echo ok\n", 10)], TOKEN)
    out = slurm.parse(srun_like(b, ["n1", "n2"], tmp_path, drop="n2"), TOKEN, ["n1", "n2"], {})
    assert out["n1"].rc == 0
    assert out["n2"].rc == 255 and "slurm task on n2 ended without a result" in out["n2"].stderr
    assert "n2: task 1: Killed" in out["n2"].stderr


def test_a_step_that_never_started_fails_every_node_with_sruns_words():
    text = f"@@{TOKEN}:head=1@@\n@@{TOKEN}:err@@ salloc: error: Job submit/allocate failed\n"
    out = slurm.parse(text, TOKEN, ["n1", "n2"], {})
    assert sorted(out) == ["n1", "n2"]
    assert all(a.rc == 255 and "allocate failed" in a.stderr for a in out.values())


def test_a_node_outside_the_table_answers_253(tmp_path):
    b = slurm.bundle([("n1", "echo ok\n", 10)], TOKEN)
    out = slurm.parse(srun_like(b, ["n1", "stray"], tmp_path), TOKEN, ["n1"], {})
    assert list(out) == ["n1"] and out["n1"].rc == 0


def test_timeouts_are_per_node(tmp_path):
    b = slurm.bundle([("n1", "sleep 5\n", 1), ("n2", "echo quick\n", 10)], TOKEN)
    t0 = time.monotonic()
    out = slurm.parse(srun_like(b, ["n1", "n2"], tmp_path), TOKEN, ["n1", "n2"], {"n1": 1})
    assert time.monotonic() - t0 < 4
    assert out["n1"].timed_out and "timed out after 1s" in out["n1"].stderr and out["n2"].rc == 0


def test_inventory_values_reaching_a_shell_are_quoted():
    b = slurm.bundle([("we'ird;$(x)", "echo\n", 10)], TOKEN)
    assert "'we'\"'\"'ird;$(x)')" in b
    h = slurm.head_script(["a"], TOKEN, 30, "12;rm", "/tmp/x y")
    assert "SLURM_JOB_ID='12;rm'" in h and "'/tmp/x y'" in h


def host(name, address):
    return SimpleNamespace(name=name, address=address)


SINFO = "worker-0|10.0.0.10|worker-0\nnode7|10.0.0.17|gpu7.cluster\n"


def test_nodes_map_to_slurm_by_name_address_or_hostname():
    got = slurm.node_map(
        [host("worker-0", "x"), host("n7", "10.0.0.17"), host("gpu7.cluster", "y")][:2],
        SINFO,
        "worker-0",
    )
    assert got == {"worker-0": "worker-0", "n7": "node7"}
    assert slurm.node_map([host("gpu7.cluster", "y")], SINFO, "h") == {"gpu7.cluster": "node7"}


def test_a_node_slurm_does_not_know_is_one_line_naming_it():
    with pytest.raises(InputError) as e:
        slurm.node_map([host("worker-0", "x"), host("ghost", "10.9.9.9")], SINFO, "worker-0")
    assert e.value.exit_code == 2 and "ghost" in str(e.value) and "\n" not in str(e.value)
    assert "--via ssh" in str(e.value)
    with pytest.raises(InputError, match="allocation"):
        slurm.node_map([host("worker-0", "x")], SINFO, "worker-0", allocation=["node7"])


def test_via_values_and_auto_inside_an_allocation():
    hosts = [host("w-0", ""), host("w-1", "")]
    with pytest.raises(InputError, match="--via 'bogus'"):
        slurmrun.resolve("bogus", hosts, {})
    assert slurmrun.resolve("auto", hosts, {}) == "ssh"
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "w-[0-1]"}
    assert slurmrun.resolve("auto", hosts, env) == "slurm"
    assert slurmrun.resolve("auto", hosts + [host("w-2", "")], env) == "ssh"
    assert slurmrun.resolve("ssh", hosts, env) == "ssh"
    assert slurmrun.allocation({"SLURM_JOB_ID": "4;2"}) == (None, None)


class FakeTransport(slurmrun.Transport):
    def __init__(self, names):
        self.slurm = {n: n for n in names}
        self._reached, self.batches = set(), []

    def _step(self, items):
        self.batches.append(sorted(n for n, _s, _l in items))
        time.sleep(0.01)
        return {n: slurm.Answer(0, f"{n}:{s}", "") for n, s, _l in items}


def test_a_stage_makes_one_step_per_round_of_runs():
    names = [f"n{i}" for i in range(20)]
    t = FakeTransport(names)
    sessions = [SimpleNamespace(name=n) for n in names]
    got, lock = {}, threading.Lock()

    def fn(s):
        if s.name == "n3":
            return  # finishes without running anything
        if s.name == "n4":
            raise RuntimeError("boom")  # a node's function failing holds nobody
        a = t.run(s, "first", 10)
        b = t.run(s, "second", 10) if s.name != "n5" else None
        with lock:
            got[s.name] = (a, b)

    t.each(lambda s: _swallow(fn, s), sessions)
    assert len(t.batches) == 2
    assert len(t.batches[0]) == 18 and len(t.batches[1]) == 17
    assert got["n0"] == (CmdResult(0, "n0:first", ""), CmdResult(0, "n0:second", ""))
    assert t.reached(sessions[0]) and not t.reached(sessions[3])


def _swallow(fn, s):
    try:
        fn(s)
    except RuntimeError:
        pass


def test_a_run_outside_a_stage_is_a_step_of_its_own():
    t = FakeTransport(["a"])
    assert t.run(SimpleNamespace(name="a"), "x", 5).stdout == "a:x"
    assert t.batches == [["a"]]
