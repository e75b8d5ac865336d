"""Wheel fan-out on a real lab (issue 18): a cold provision sends the wheels from the controller
to ONE node, the others get them node to node over the mesh (each checked against the
controller's sha256 on arrival); a copy spoiled on the way is caught and pushed directly; a
node that already holds the wheels feeds the ones that lack them; a converged run relays
nothing. Lab "fan" (its own subnet from its name), 3 nodes, each link limited to 200 Mbit/s.

The wheels are small ones made here (a few MB of random bytes each, valid wheel metadata),
served to the controller's `pip download` from a local directory: the test is about moving
them, not about resolving a real stack."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from nodeprep import cli as api
from nodeprep import lab as labmod
from nodeprep.commands.options import ProvisionOptions
from nodeprep.settings import Settings

from .synthetic import make_wheel

NAME, NODES = "fan", 3
ROLES = "ssh_keys,ssh_config,wheelhouse"


@pytest.fixture(scope="module")
def fan(tmp_path_factory):
    base = tmp_path_factory.mktemp("fan")
    settings = Settings(state_dir=str(base / "state"), lab_root=str(base / "labs"), lock_wait=60)
    labmod.down(NAME, settings, log=lambda m: None)
    info = labmod.up(
        NODES,
        NAME,
        settings,
        labmod.UpOptions(inventory_dir=base / "inv", link_rate="200mbit"),
        log=lambda m: None,
    )
    wheels = base / "wheels"
    wheels.mkdir()
    for i in range(3):
        make_wheel(wheels, f"npfan{i}", 3_000_000 + i)
    (base / "req.txt").write_text("".join(f"npfan{i}==1.0\n" for i in range(3)))
    yield info, settings, base
    labmod.down(NAME, settings, log=lambda m: None)


@pytest.fixture
def run(fan, monkeypatch, capsys):
    info, settings, base = fan
    # pip on the controller resolves from the made wheels alone
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(base / "wheels"))

    def go(*sets):
        code = api.provision(
            ProvisionOptions(
                inventory=str(info.inventory),
                limit=None,
                roles=ROLES,
                check_mode=False,
                diff=False,
                json=True,
                sets=(
                    f"python_requirements=[{base / 'req.txt'}]",
                    "wheel_builds={}",
                    "torch_version=",
                    f"controller_key={base}/ctl/id",
                    f"controller_ssh_config={base}/ctl/config",
                    *sets,
                ),
            ),
            settings,
        )
        out = capsys.readouterr()
        assert code == 0, out.err[-3000:]
        return json.loads(out.out)

    return go


def wheelhouse(info, i) -> Path:
    return Path(info.nodes[i].home) / ".nodeprep" / "wheelhouse"


def sums(d: Path) -> dict:
    """{wheel: sha256} of a wheelhouse; never empty (two empty ones would compare equal)."""
    found = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.glob("*.whl"))}
    assert found, f"no wheels in {d}"
    return found


def wipe(info, *idx):
    for i in idx:
        shutil.rmtree(wheelhouse(info, i), ignore_errors=True)


def relayed(rep) -> dict:
    return {n: r.get("wheelhouse") for n, r in rep["nodes"].items()}


def test_cold_provision_relays_node_to_node(fan, run):
    info, _settings, base = fan
    wipe(info, *range(NODES))
    rep = run()
    w = relayed(rep)
    assert [w[f"worker-{i}"]["from"] for i in range(NODES)] == [
        "controller",
        "worker-0",
        "worker-1",
    ]
    assert all(x["fallback"] is None and x["relay_error"] is None for x in w.values()), w
    assert all(x["verified_on_arrival"] == 3 for x in w.values())
    total = sum((base / "wheels" / f).stat().st_size for f in sums(base / "wheels"))
    sent = sum(x["controller_bytes"] for x in w.values())
    assert total <= sent <= total * 1.01  # one copy (plus the tar headers)
    assert w["worker-1"]["controller_bytes"] == w["worker-2"]["controller_bytes"] == 0
    want = sums(base / "wheels")
    for i in range(NODES):
        d = wheelhouse(info, i)
        assert sums(d) == want
        assert not (d / ".relay").exists() and not list(d.glob(".*.part"))
        assert not list((d.parent).glob("relay-*.sh"))
    assert any("chained from the controller" in n for n in rep["notes"])
    # converged: nothing relayed, nothing pushed
    rep = run()
    assert rep["changed"] == 0 and not any(relayed(rep).values())


def test_spoiled_relay_copy_is_caught_and_pushed_directly(fan, run):
    """worker-1's `ssh` (first on its PATH through ~/.bashrc, as a broken or hostile node's
    could be) spoils 16 bytes of what it passes on to worker-2, inside the first wheel: worker-2's
    arrival check refuses that wheel and the controller pushes it itself; the run says so."""
    info, _settings, base = fan
    home = Path(info.nodes[1].home)
    wipe(info, 1, 2)
    (home / "bin").mkdir(exist_ok=True)
    ssh = home / "bin" / "ssh"
    ssh.write_text(
        "#!/bin/sh\n"
        'case "$*" in *"/bin/sh .nodeprep/relay-"*)\n'
        "  { head -c 20000; head -c 16 >/dev/null; printf XXXXXXXXXXXXXXXX; cat; } | "
        '/usr/bin/ssh "$@"\n'
        "  exit $?;;\nesac\n"
        'exec /usr/bin/ssh "$@"\n'
    )
    ssh.chmod(0o755)
    rc = home / ".bashrc"
    old = rc.read_text()
    rc.write_text('PATH="$HOME/bin:$PATH"; export PATH\n' + old)
    subprocess.run(["chown", "-R", "nodeprep:", str(home / "bin"), str(rc)], check=True)
    try:
        rep = run()
    finally:
        rc.write_text(old)
        shutil.rmtree(home / "bin")
    w = relayed(rep)
    assert w["worker-1"]["from"] == "worker-0" and w["worker-1"]["fallback"] is None
    assert w["worker-2"]["from"] == "worker-1"
    assert "sha256 mismatch on 1 relayed wheel" in w["worker-2"]["fallback"]
    assert w["worker-2"]["verified_on_arrival"] == 2
    assert 3_000_000 <= w["worker-2"]["controller_bytes"] < 3_100_000  # that one wheel
    assert (
        w["worker-0"] is None
    )  # worker-0 held them: it headed the chain, the controller sent none
    assert any("chained from worker-0" in n for n in rep["notes"])
    assert sums(wheelhouse(info, 2)) == sums(base / "wheels")
    assert rep["nodes"]["worker-2"]["status"] == "changed"


def test_a_node_holding_the_wheels_feeds_the_others(fan, run):
    info, _settings, base = fan
    run()
    wipe(info, 0, 2)
    rep = run()
    w = relayed(rep)
    assert w["worker-0"]["from"] == "worker-1" and w["worker-2"]["from"] == "worker-0"
    assert sum(x["controller_bytes"] for x in w.values() if x) == 0
    for i in range(NODES):
        assert sums(wheelhouse(info, i)) == sums(base / "wheels")


def test_relay_off_pushes_from_the_controller(fan, run):
    info, _settings, base = fan
    wipe(info, 1)
    rep = run("wheelhouse_relay=false")
    w = relayed(rep)
    assert w["worker-0"] is None and w["worker-2"] is None
    assert w["worker-1"]["from"] == "controller" and w["worker-1"]["verified_on_arrival"] == 0
    assert w["worker-1"]["controller_bytes"] >= 9_000_000
    assert sums(wheelhouse(info, 1)) == sums(base / "wheels")


def test_nodes_sharing_a_home_get_the_wheels_once(fan, run):
    """One home for every node (as NFS gives): only the node acting for it gets the wheels,
    straight from the controller (no chain to build); the others verify. Last: it reshapes
    the lab (the fixture takes it down after)."""
    info, settings, base = fan
    labmod.down(NAME, settings, log=lambda m: None)
    labmod.up(
        NODES,
        NAME,
        settings,
        labmod.UpOptions(inventory_dir=base / "inv", link_rate="200mbit", shared_home=True),
        log=lambda m: None,
    )
    wipe(info, 0)
    rep = run()
    w = relayed(rep)
    assert w["worker-0"]["from"] == "controller" and w["worker-0"]["fallback"] is None
    assert w["worker-1"] is None and w["worker-2"] is None
    total = sum((base / "wheels" / f).stat().st_size for f in sums(base / "wheels"))
    assert total <= w["worker-0"]["controller_bytes"] <= total * 1.01
    step = next(s for s in rep["nodes"]["worker-2"]["steps"] if "wheelhouse.sync" in s["step"])
    assert (step["status"], step["message"]) == ("ok", "by worker-0 (shared home)")
    assert sums(wheelhouse(info, 2)) == sums(base / "wheels")
