"""Shared homes and machines: the IDENTITY fact run for real, ops/provision/topology's groups,
the scope of steps, provision's check of a step another node acts for, and its waves run
against directories on this machine (no ssh, no lab)."""

import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

from nodeprep.commands import waves
from nodeprep.commands.waves import _check_all
from nodeprep.engine.facts import FILE, IDENTITY, FactValues
from nodeprep.engine.results import NodeResult, StepResult
from nodeprep.engine.steps import FileBlock, FileContent, Step, StepCheck, scope_of, with_block
from nodeprep.ops.provision.roles import Role
from nodeprep.ops.provision.topology import Topology
from nodeprep.settings import Settings

WORKERS = [f"worker-{i}" for i in range(4)]
MID = "8e5f2c1a9b3d4e7f8a6b5c4d3e2f1a0b"


def _ident(home=None, machine=None) -> FactValues:
    return FactValues({IDENTITY.key: {"home": home, "machine": machine}})


# -- the IDENTITY script, run by /bin/sh ------------------------------------------------------


def _run_identity(home: Path) -> str:
    env = dict(os.environ, HOME=str(home))
    p = subprocess.run(
        ["/bin/sh", "-c", IDENTITY.command({})], capture_output=True, text=True, env=env, timeout=30
    )
    assert p.returncode == 0, p.stderr
    return p.stdout


def _first_line(*paths) -> str | None:
    """The first line of the first of PATHS that has one (/proc files have no size)."""
    for f in paths:
        try:
            lines = Path(f).read_text().splitlines()
        except OSError:
            continue
        if lines and lines[0]:
            return lines[0]
    return None


def test_identity_script_for_real(tmp_path):
    # one text for every node and run (the head's fan-out sends it once); the id is drawn there
    assert IDENTITY.command({}) == IDENTITY.command({})
    out1, out2 = _run_identity(tmp_path), _run_identity(tmp_path)
    one, two = IDENTITY.parse(out1, 0), IDENTITY.parse(out2, 0)
    home_id = (tmp_path / ".nodeprep" / "home-id").read_text().strip()
    assert len(home_id) >= 16 and int(home_id, 16) >= 0
    other = tmp_path / "other"
    other.mkdir()
    _run_identity(other)  # another home draws another id
    assert (other / ".nodeprep" / "home-id").read_text().strip() != home_id
    assert one["home"] == two["home"] == home_id  # the first one written wins
    # nothing but the id is left in ~/.nodeprep (the temp file of each probe is removed)
    assert sorted(p.name for p in (tmp_path / ".nodeprep").iterdir()) == ["home-id"]
    mid = _first_line("/etc/machine-id", "/var/lib/dbus/machine-id")
    boot = _first_line("/proc/sys/kernel/random/boot_id")
    machine_lines = [ln for ln in out1.splitlines() if ln.startswith("machine ")]
    assert machine_lines == [f"machine {mid or '-'} {boot or '-'}"]
    assert one["machine"] == two["machine"] == (f"{mid}:{boot}" if mid and boot else None)


def test_identity_probes_racing_on_a_new_home_agree(tmp_path):
    for i in range(5):
        home = tmp_path / f"h{i}"
        home.mkdir()
        env = dict(os.environ, HOME=str(home))
        procs = [
            subprocess.Popen(
                ["/bin/sh", "-c", IDENTITY.command({})], stdout=subprocess.PIPE, text=True, env=env
            )
            for _ in range(4)
        ]
        homes = {IDENTITY.parse(p.communicate(timeout=30)[0], 0)["home"] for p in procs}
        assert homes == {(home / ".nodeprep" / "home-id").read_text().strip()}
        assert sorted(p.name for p in (home / ".nodeprep").iterdir()) == ["home-id"]


def test_identity_of_a_home_that_cannot_be_written(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = _run_identity(blocker / "home")  # mkdir under a regular file fails, even for root
    assert "home -" in out.splitlines()
    assert IDENTITY.parse(out, 0)["home"] is None


# -- Topology ------------------------------------------------------------------------------------


def test_private_homes_every_node_leads():
    facts = {n: _ident(f"home{i}", f"{MID}:boot-{i}") for i, n in enumerate(WORKERS)}
    t = Topology.of(facts, WORKERS)
    assert not t.shared
    assert t.describe() == []
    for n in WORKERS:
        assert t.leads_all(n)
        assert t.actor(n, "home") == t.actor(n, "machine") == t.actor(n, "node") == n


def test_shared_home_and_one_machine():
    facts = {
        "worker-0": _ident("h1", "m:b0"),
        "worker-1": _ident("h1", "m:b1"),
        "worker-2": _ident("h1", "m:b2"),
        "worker-3": _ident("h1", "m:b0"),
    }
    t = Topology.of(facts, WORKERS)
    assert t.shared
    assert t.homes == {"h1": WORKERS}
    assert t.by_machine_id == {
        "m:b0": ["worker-0", "worker-3"],
        "m:b1": ["worker-1"],
        "m:b2": ["worker-2"],
    }
    assert [t.actor(n, "home") for n in WORKERS] == ["worker-0"] * 4
    assert [t.actor(n, "machine") for n in WORKERS] == [
        "worker-0",
        "worker-1",
        "worker-2",
        "worker-0",
    ]
    assert [t.actor(n, "node") for n in WORKERS] == WORKERS
    assert [t.leads_all(n) for n in WORKERS] == [True, False, False, False]
    assert t.describe() == [
        "worker-[0-3] share one home (worker-0 acts for it)",
        "worker-[0,3] are one machine (worker-0 acts for it)",
    ]


def test_inventory_order_picks_the_actor():
    facts = {n: _ident("h1", "m:b0") for n in WORKERS}
    order = ["worker-2", "worker-0", "worker-3", "worker-1"]
    t = Topology.of(facts, order)
    assert all(t.actor(n, "home") == t.actor(n, "machine") == "worker-2" for n in WORKERS)
    assert [n for n in order if t.leads_all(n)] == ["worker-2"]
    assert t.describe() == [
        "worker-[0-3] share one home (worker-2 acts for it)",
        "worker-[0-3] are one machine (worker-2 acts for it)",
    ]


def test_nodes_without_identity_are_alone():
    facts = {
        "worker-0": _ident("h1", "m:b0"),
        "worker-1": _ident("h1", "m:b0"),
        "worker-2": _ident(None, None),  # probe found neither
        "worker-3": FactValues(),
    }  # no IDENTITY fact at all
    order = WORKERS + ["worker-4"]  # worker-4: no facts (unreachable)
    t = Topology.of(facts, order)
    for n in ("worker-2", "worker-3", "worker-4"):
        assert t.actor(n, "home") == t.actor(n, "machine") == n
        assert t.leads_all(n)
    assert t.actor("worker-1", "home") == "worker-0" and not t.leads_all("worker-1")
    assert t.describe() == [
        "worker-[0-1] share one home (worker-0 acts for it)",
        "worker-[0-1] are one machine (worker-0 acts for it)",
    ]


def test_topology_from_parsed_identity_output():
    boot = "c2a4e6f8-1b3d-4f5a-9c7e-0d2b4f6a8c1e"
    outs = {
        "worker-0": f"machine {MID} {boot}\nhome 5f3a9c1e7b2d4086\n",
        "worker-1": f"machine {MID} {boot}\nhome 5f3a9c1e7b2d4086\n",  # alias of worker-0
        "worker-2": f"machine - {boot}\nhome -\n",
    }
    facts = {n: FactValues({IDENTITY.key: IDENTITY.parse(o, 0)}) for n, o in outs.items()}
    t = Topology.of(facts, list(outs))
    assert t.actor("worker-1", "machine") == t.actor("worker-1", "home") == "worker-0"
    assert t.leads_all("worker-2")


# -- scope of steps ------------------------------------------------------------------------------


def test_scope_of_paths():
    assert scope_of("~") == "home"
    assert scope_of("~/.bashrc") == "home"
    assert scope_of("~/.nodeprep/venv/bin/python") == "home"
    assert scope_of("$HOME/.bashrc") == "home"
    assert scope_of("/etc/profile.d/nodeprep.sh") == "machine"
    assert scope_of("/tmp/nodeprep-0-abc.lock") == "machine"
    assert scope_of("/home/alice/.bashrc") == "machine"  # not known to be the user's home


def test_file_steps_declare_their_scope():
    assert FileBlock("~/.ssh/config", "hosts", "Host x\n").scope == "home"
    assert FileContent("~/.deepspeed_env", "A=1\n").scope == "home"
    assert FileBlock("/etc/ssh/ssh_config", "hosts", "Host x\n").scope == "machine"
    assert FileContent("/opt/x.conf", "").scope == "machine"
    assert Step("probe.x", [], lambda f: StepCheck(True)).scope == "node"


# -- provision: checking the steps of a node that shares a home or machine --------------------

BODY = 'export PATH=/opt/x/bin:"$PATH"\n'
WANT = with_block("# user stuff\n", "env", BODY, "top")


def _file(content):
    return {
        "exists": content is not None,
        "mode": 0o644 if content is not None else None,
        "size": len(content or ""),
        "content": content,
    }


def _topo() -> Topology:
    facts = {
        "worker-0": _ident("h1", "m:b0"),
        "worker-1": _ident("h1", "m:b1"),
        "worker-2": _ident("h1", "m:b2"),
        "worker-3": _ident("h1", "m:b0"),
    }
    return Topology.of(facts, WORKERS)


class NoGather:
    """A session for _check_all: every fact is given, so it must never probe the node."""

    def __init__(self, name):
        self.name, self.result = name, NodeResult(name)

    def run(self, *_a, **_k):
        raise AssertionError("_check_all probed the node though every fact was given")


def _steps():
    home = FileBlock("~/.bashrc", "env", BODY, where="top")
    machine = FileContent("/etc/profile.d/nodeprep.sh", "export A=1\n")
    node = Step("probe.node-local", [], lambda f: StepCheck(False, "off"), action="true")
    for st, role in ((home, "shell"), (machine, "sys"), (node, "local")):
        st.role = role
    return home, machine, node


def _facts(bashrc, profile="export A=1\n"):
    return FactValues(
        {
            FILE("~/.bashrc").key: _file(bashrc),
            FILE("/etc/profile.d/nodeprep.sh").key: _file(profile),
        }
    )


def _check(node, facts, check_mode, steps=None):
    topo, s = _topo(), NoGather(node)
    differ = _check_all(
        s, list(steps or _steps()), facts, check_mode, lambda st: topo.actor(node, st.scope)
    )
    return s.result, differ


def test_follower_home_step_that_matches_is_ok_by_the_actor():
    home, machine, _node = _steps()
    for check_mode in (False, True):
        res, differ = _check("worker-1", _facts(WANT), check_mode, [home, machine])
        assert differ == []
        assert res.steps == [
            StepResult("shell: file.block ~/.bashrc [env]", "ok", "by worker-0 (shared home)"),
            StepResult("sys: file.content /etc/profile.d/nodeprep.sh", "ok"),
        ]
        assert res.status == "ok"


def test_follower_home_step_that_differs_fails_after_the_actor():
    home, _m, _n = _steps()
    res, differ = _check("worker-1", _facts("# user stuff\n"), False, [home])
    assert differ == []
    [r] = res.steps
    assert (r.name, r.status) == ("shell: file.block ~/.bashrc [env]", "failed")
    assert r.message.startswith(
        "still differs after worker-0 acted for the shared home: block 'env' differs"
    )
    assert res.status == "failed"


def test_follower_home_step_that_differs_is_skipped_in_check_mode():
    home, _m, _n = _steps()
    res, differ = _check("worker-1", _facts(None), True, [home])
    assert differ == []
    assert res.steps == [
        StepResult(
            "shell: file.block ~/.bashrc [env]", "skipped", "worker-0 acts for the shared home"
        )
    ]
    assert res.status == "ok"


def test_follower_still_acts_for_its_own_node_and_machine_steps():
    home, machine, node = _steps()
    res, differ = _check("worker-1", _facts(WANT, profile=None), False)
    assert [(st.name, c.why) for st, c in differ] == [
        ("file.content /etc/profile.d/nodeprep.sh", "missing"),
        ("probe.node-local", "off"),
    ]
    assert res.steps == [
        StepResult("shell: file.block ~/.bashrc [env]", "ok", "by worker-0 (shared home)")
    ]
    # in --check the differing ones say what would change
    res, differ = _check("worker-1", _facts(WANT, profile=None), True, [home, machine, node])
    assert [st for st, _c in differ] == [machine, node]
    assert [(r.status, r.message) for r in res.steps] == [
        ("ok", "by worker-0 (shared home)"),
        ("changed", "would change: missing"),
        ("changed", "would change: off"),
    ]


def test_second_node_of_a_machine_only_verifies_machine_steps():
    _h, machine, node = _steps()
    res, differ = _check("worker-3", _facts(WANT, profile="export A=2\n"), False, [machine, node])
    assert [st for st, _c in differ] == [node]
    [r] = res.steps
    assert (r.name, r.status) == ("sys: file.content /etc/profile.d/nodeprep.sh", "failed")
    assert r.message.startswith(
        "still differs after worker-0 acted for the shared machine: content differs"
    )


def test_actor_node_acts_for_the_group():
    home, machine, node = _steps()
    res, differ = _check("worker-0", _facts("# user stuff\n"), False, [home, machine, node])
    assert [st for st, _c in differ] == [home, node]
    assert res.steps == [StepResult("sys: file.content /etc/profile.d/nodeprep.sh", "ok")]


def test_without_actor_every_step_is_this_nodes():
    home, machine, node = _steps()
    s = NoGather("worker-1")
    differ = _check_all(s, [home, machine, node], _facts("# user stuff\n"), False)
    assert [st for st, _c in differ] == [home, node]


def test_step_with_no_action_on_the_actor_fails_with_its_hint():
    st = Step("probe.gpu", [], lambda f: StepCheck(False, "no driver"), hint="install one")
    st.role = "gpu"
    res, differ = _check("worker-0", _facts(WANT), False, [st])
    assert differ == []
    assert res.steps == [StepResult("gpu: probe.gpu", "failed", "no driver; install one")]


# -- provision's waves, for real on this machine: one home directory per home id ---------------


class LocalNode:
    """A node whose scripts run under /bin/sh here, with HOME the directory of its home."""

    def __init__(self, name, home: Path, display):
        self.name, self.home, self.events = name, home, display
        self.host = SimpleNamespace(name=name)
        self.result = NodeResult(name)
        self.settings = Settings()

    def silent(self) -> bool:
        return False

    def run(self, script, timeout=None, label=None, **_kw):
        env = dict(os.environ, HOME=str(self.home))
        p = subprocess.run(
            ["/bin/sh", "-c", script],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout or 60,
        )
        return SimpleNamespace(
            rc=p.returncode,
            stdout=p.stdout,
            stderr=p.stderr,
            tail=lambda n=12: "\n".join(p.stderr.strip().splitlines()[-n:]),
        )


class LocalFleet:
    def __init__(self, homes: dict):
        self.events = SimpleNamespace(
            status=lambda *a, **k: None, note=lambda *a: None, log=lambda *a: None
        )
        self.sessions = {n: LocalNode(n, h, self.events) for n, h in homes.items()}

    def map(self, fn, stage, only=None):
        return {n: fn(s) for n, s in self.sessions.items() if only is None or n in only}


SHELL_ROLE = Role(
    "shell",
    SimpleNamespace(
        steps=lambda ctx: [FileBlock("~/.bashrc", "env", BODY, where="top")],
        reads=lambda ctx: [FILE("~/.bashrc")],
    ),
)


def _provision(tmp_path, homes: dict, machines: dict):
    """Plan and apply the shell role over nodes {name: home dir name}, with the machine ids
    given; returns {node: [(status, message)]} and the home directories."""
    dirs = {h: tmp_path / h for h in set(homes.values())}
    for d in dirs.values():
        d.mkdir()
        (d / ".bashrc").write_text("# user stuff\n")
    fleet = LocalFleet({n: dirs[h] for n, h in homes.items()})
    roles = [SHELL_ROLE]
    prov = SimpleNamespace(vars={n: {} for n in homes}, facts={})
    prov.facts = fleet.map(lambda s: waves.probe(s, roles, prov), "facts")
    # the ids this machine reports are the same for every node: give each its own
    for n in homes:
        prov.facts[n][IDENTITY.key] = {"home": homes[n], "machine": machines[n]}
    prov.topology = Topology.of(prov.facts, list(homes))
    waves.Waves(fleet, roles, prov, check_mode=False).all(list(homes))
    return {
        n: [(r.status, r.message) for r in s.result.steps] for n, s in fleet.sessions.items()
    }, dirs


def test_waves_followers_verify_after_their_actor(tmp_path):
    got, dirs = _provision(
        tmp_path,
        {"worker-0": "h", "worker-1": "h", "worker-2": "h"},
        {"worker-0": "A", "worker-1": "A", "worker-2": "B"},
    )
    assert got == {
        "worker-0": [("changed", "block 'env' differs")],
        "worker-1": [("ok", "by worker-0 (shared home)")],
        "worker-2": [("ok", "by worker-0 (shared home)")],
    }
    assert (dirs["h"] / ".bashrc").read_text() == WANT


def test_waves_actor_of_a_home_that_follows_on_its_machine(tmp_path):
    # alice@A, bob@A (another user on the same machine), bob@B (bob's NFS home on B): bob@A
    # acts for bob's home but follows alice@A on machine A, so it is not in the first wave;
    # bob@B must still verify bob's home only after bob@A wrote it.
    got, dirs = _provision(
        tmp_path,
        {"alice-a": "alice", "bob-a": "bob", "bob-b": "bob"},
        {"alice-a": "A", "bob-a": "A", "bob-b": "B"},
    )
    assert (dirs["bob"] / ".bashrc").read_text() == WANT
    assert got == {
        "alice-a": [("changed", "block 'env' differs")],
        "bob-a": [("changed", "block 'env' differs")],
        "bob-b": [("ok", "by bob-a (shared home)")],
    }
