"""The container way on a lab with a real engine (issue 45): `lab.up --containers` gives every
node rootless Podman 4.3.1 and crun from Debian's packages (lab/containers.py). The image is the
lab's Debian 12 + Python root, built once by mmdebstrap and saved as a docker-archive on the
controller (lab/images.py); nodeprep sends it to every node and loads it, by its ID.

Lab "ctr" (10.193.0.0/16), 2 nodes, the container role alone (it needs no package index)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from nodeprep import cli as api
from nodeprep import lab as labmod
from nodeprep.commands.options import ProvisionOptions, VerifyOptions
from nodeprep.lab import images
from nodeprep.lab import registry as labreg
from nodeprep.ops.container import archive, run

from .conftest import ssh_argv

NAME, SUBNET, NODES = "ctr", 193, 2
IMAGES = Path(__file__).parents[1] / "recordings" / "images"


@pytest.fixture(scope="module")
def ctr(tmp_path_factory, own_settings):
    base = tmp_path_factory.mktemp("ctr")
    settings = own_settings(base, lock_wait=60)
    labmod.down(NAME, settings, log=lambda m: None)
    info = labmod.up(
        NODES,
        NAME,
        settings,
        labmod.UpOptions(inventory_dir=base / "inv", subnet=SUBNET, containers=True),
        log=lambda m: None,
    )
    image = images.docker_archive(images.base_root(), base / "np-lab.tar", "localhost/np-lab:1")
    yield info, settings, base, image
    labmod.down(NAME, settings, log=lambda m: None, purge=True)


def _ssh(ctr, index: int, command: str) -> subprocess.CompletedProcess:
    info, settings = ctr[0], ctr[1]
    argv = ssh_argv(info, info.nodes[index], settings, command)
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def provision(info, settings, capsys, *sets: str) -> tuple[int, dict, str]:
    opts = ProvisionOptions(
        inventory=str(info.inventory), roles="container", json=True, sets=tuple(sets)
    )
    rc = api.provision(opts, settings)
    out = capsys.readouterr()
    assert out.out, out.err
    return rc, json.loads(out.out), out.err


def steps_of(report: dict, node: str) -> list[dict]:
    return [s for s in report["nodes"][node]["steps"] if s["step"].startswith("container: ")]


def test_the_image_reaches_every_node_by_its_id_then_nothing_to_change(ctr, capsys):
    info, settings, _base, image = ctr
    want = archive.read(image).id
    rc, report, _ = provision(info, settings, capsys, f"container_image={image}")
    assert rc == 0, report
    for node in ("worker-0", "worker-1"):
        assert any(s["status"] == "changed" for s in steps_of(report, node)), report["nodes"][node]
    rc, report, _ = provision(info, settings, capsys, f"container_image={image}")
    assert rc == 0 and report["changed"] == 0, report
    for i in range(NODES):
        r = _ssh(ctr, i, "podman images --no-trunc --format '{{.ID}}'")
        assert want in r.stdout.split(), (r.stdout, r.stderr)
        # a real container on the node's own network: the node's name from inside the image
        r = _ssh(
            ctr,
            i,
            f"podman run --rm --network host {want} "
            "python3 -c 'import socket; print(socket.gethostname())'",
        )
        assert r.returncode == 0 and r.stdout.strip() == f"worker-{i}", r.stderr


def test_the_image_goes_node_to_node_the_controller_sends_one_copy(ctr, capsys):
    """With the ssh mesh in the run, the archive travels as the wheels do: the controller
    feeds the chain's first node, each node passes it on, every copy is checked against the
    controller's sha256 before the node loads it."""
    info, settings, base, image = ctr
    for i in range(NODES):
        assert _ssh(ctr, i, "podman rmi -a -f >/dev/null 2>&1; true").returncode == 0
    sets = (
        f"container_image={image}",
        f"controller_key={base}/ctl/id",
        f"controller_ssh_config={base}/ctl/config",
    )
    opts = ProvisionOptions(
        inventory=str(info.inventory), roles="ssh_keys,container", json=True, sets=sets
    )
    assert api.provision(opts, settings) == 0
    report = json.loads(capsys.readouterr().out)
    assert any(
        "container image relay" in n and "2 node(s) chained from the controller" in n
        for n in report["notes"]
    ), report["notes"]
    got = {n: report["nodes"][n]["container_image"] for n in ("worker-0", "worker-1")}
    assert got["worker-0"]["from"] == "controller" and got["worker-1"]["from"] == "worker-0", got
    size = image.stat().st_size  # one copy, in a tar stream (headers and padding)
    assert size <= got["worker-0"]["controller_bytes"] < size + 64 * 1024, got
    assert got["worker-1"]["controller_bytes"] == 0 and not got["worker-1"]["fallback"], got
    want = archive.read(image).id
    for i in range(NODES):
        assert want in _ssh(ctr, i, "podman images --no-trunc --format '{{.ID}}'").stdout


def parity(info, settings, capsys, image, where: Path) -> dict:
    """verify-parity --json over the lab's inventory with container_image set (verify takes
    no --set: the value goes into a copy of the inventory)."""
    text = info.inventory.read_text().replace("vars:\n", f"vars:\n  container_image: {image}\n", 1)
    inv = where / "hosts.yml"
    inv.write_text(text)
    api.verify_parity(VerifyOptions(inventory=str(inv), json=True, port=None), settings)
    return json.loads(capsys.readouterr().out)


def drift_of(report: dict, key: str) -> list[dict] | None:
    return next((d["groups"] for d in report["drift"] if d["key"] == key), None)


def test_parity_names_the_image_ids_when_a_node_holds_another(ctr, capsys, tmp_path):
    """Both nodes hold the image: no container drift. Then worker-1's image under the same
    name is another one (its ID differs): DRIFT on container.image naming both IDs."""
    info, settings, _base, image = ctr
    want = archive.read(image).id
    rc, report, _ = provision(info, settings, capsys, f"container_image={image}")
    assert rc == 0, report
    report = parity(info, settings, capsys, image, tmp_path)
    assert (
        drift_of(report, "container.image") is None and drift_of(report, "container.engine") is None
    )
    # another image under the lab image's name on worker-1: the tiny recording, retagged
    tiny = archive.read(IMAGES / "tiny-docker.tar")
    home = info.nodes[1].home
    shutil.copy(IMAGES / "tiny-docker.tar", home / "t.tar")
    os.chown(home / "t.tar", home.stat().st_uid, home.stat().st_gid)
    r = _ssh(
        ctr,
        1,
        f"podman rmi -f {want} >/dev/null; podman load -q -i t.tar && "
        f"podman tag {tiny.id} localhost/np-lab:1; rm -f t.tar",
    )
    assert r.returncode == 0, r.stderr
    report = parity(info, settings, capsys, image, tmp_path)
    groups = drift_of(report, "container.image")
    assert groups is not None, report["drift"]
    values = {g["value"]: g["nodes"] for g in groups}
    assert values == {want: ["worker-0"], tiny.id: ["worker-1"]}, groups
    assert not report["ok"]


def test_a_job_container_runs_by_the_argv_nodeprep_builds(ctr, capsys):
    """ops/container/run.py's argv through real Podman on a node: started detached with the
    node's network and IPC, a variable passed by name, a command exec'd in it as the user
    (keep-id), files in the job directory the user's; removed, nothing left."""
    info, settings, _base, image = ctr
    want = archive.read(image).id
    rc, report, _ = provision(info, settings, capsys, f"container_image={image}")
    assert rc == 0, report
    job = "/home/nodeprep/.nodeprep/jobs/ctest"
    box = run.NodeContainer("podman", want, "ctest", job, env=("NP_GREETING",))
    probe = (
        "import os, socket; open('made-inside', 'w').write('x'); "
        "print(socket.gethostname(), os.environ['NP_GREETING'], os.getuid(), "
        "os.path.exists('/dev/shm/np-host-mark'))"
    )
    script = (
        f"mkdir -p {job} && touch /dev/shm/np-host-mark && export NP_GREETING=hello && "
        f"{shlex.join(box.start())} >/dev/null && "
        f"{shlex.join(box.exec(['python3', '-c', probe]))} && stat -c %u {job}/made-inside; "
        f"np_rc=$?; {shlex.join(box.remove())} >/dev/null; rm -f /dev/shm/np-host-mark; "
        f"echo left=$({shlex.join(box.leftovers())} | wc -l); exit $np_rc"
    )
    r = _ssh(ctr, 0, script)
    assert r.returncode == 0, (r.stdout, r.stderr)
    lines = r.stdout.split()
    uid = str(info.nodes[0].home.stat().st_uid)
    assert lines[:4] == ["worker-0", "hello", uid, "True"], r.stdout
    assert lines[4] == uid and lines[-1] == "left=0", r.stdout


def test_a_node_whose_image_storage_is_too_small_is_named_before_anything_is_sent(ctr, capsys):
    info, settings, _base, image = ctr
    quiet = "podman system migrate >/dev/null 2>&1; true"
    assert _ssh(ctr, 1, f"podman rmi -a -f >/dev/null 2>&1; {quiet}").returncode == 0
    labmod.limit_space(info, 1, ".local/share/containers", "64m")
    try:
        rc, report, _ = provision(info, settings, capsys, f"container_image={image}")
    finally:
        assert _ssh(ctr, 1, quiet).returncode == 0
        labmod.limit_space(info, 1, ".local/share/containers", None)
        assert _ssh(ctr, 1, quiet).returncode == 0
    assert rc != 0
    text = json.dumps(report["nodes"]["worker-1"])
    assert "image storage" in text and "GB free" in text and "system prune" in text, text
    sent = list((info.nodes[1].home / ".nodeprep" / "images").rglob("*.tar*"))
    assert sent == []  # nothing was sent


def test_an_engine_the_node_lacks_is_named_with_its_fix(ctr, capsys):
    info, settings, _base, image = ctr
    rc, report, err = provision(
        info, settings, capsys, f"container_image={image}", "container_engine=docker"
    )
    assert rc != 0
    step = steps_of(report, "worker-0")[0]
    assert step["status"] == "failed" and "docker is not on the PATH" in step["message"]
    assert "apt-get install docker.io" in json.dumps(report["nodes"]["worker-0"])


def test_a_user_without_subordinate_ids_is_named_with_its_fix(ctr, capsys):
    info, settings, _base, image = ctr
    subuid = info.nodes[1].home.parent / "etc" / "subuid"
    kept = subuid.read_text()
    subuid.write_text("")
    try:
        rc, report, _ = provision(info, settings, capsys, f"container_image={image}")
    finally:
        subuid.write_text(kept)
        # podman's pause process keeps the mapping it was started with (the fix says so too)
        assert _ssh(ctr, 1, "podman system migrate").returncode == 0
    assert rc != 0
    text = json.dumps(report["nodes"]["worker-1"])
    assert "no subordinate ids for nodeprep" in text and "--add-subuids" in text
    assert all(s["status"] != "failed" for s in steps_of(report, "worker-0"))


def test_a_bad_image_value_is_one_line_naming_the_variable(ctr, capsys, tmp_path):
    info, settings, _base, _image = ctr
    opts = ProvisionOptions(
        inventory=str(info.inventory), roles="container", sets=("container_image=Not An/Image",)
    )
    assert api.provision(opts, settings) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[0].startswith("error: ") and "container_image" in err.splitlines()[0]
    plain = tmp_path / "notes.tar"
    plain.write_bytes(b"")
    opts = ProvisionOptions(
        inventory=str(info.inventory), roles="container", sets=(f"container_image={plain}",)
    )
    assert api.provision(opts, settings) == 2
    assert "not an image archive" in capsys.readouterr().err


# -- from a registry: Debian's docker-registry at the lab's bridge (lab/registry.py) ---------


@pytest.fixture(scope="module")
def reg(ctr):
    """The lab's registry holding the lab image as WHERE/team/np-lab:1; the controller's skopeo
    told it serves plain HTTP (lab-only, as on the nodes)."""
    info, settings, _base, image = ctr
    lab = Path(settings.lab_root) / NAME
    where = labreg.start(lab, SUBNET, info.nodes)
    kept = os.environ.get("CONTAINERS_REGISTRIES_CONF")
    os.environ["CONTAINERS_REGISTRIES_CONF"] = str(labreg.controller_conf(lab, where))
    labreg.push(image, f"{where}/team/np-lab:1")
    yield where
    if kept is None:
        os.environ.pop("CONTAINERS_REGISTRIES_CONF", None)
    else:
        os.environ["CONTAINERS_REGISTRIES_CONF"] = kept
    labreg.stop(lab)


def _failed(report: dict) -> list:
    return [
        (n, s["step"], s.get("message"), s.get("output"))
        for n, r in report["nodes"].items()
        for s in r["steps"]
        if s["status"] == "failed"
    ]


def _held(ctr, i: int) -> str:
    r = _ssh(ctr, i, "podman images --no-trunc --format '{{.ID}} {{.Repository}}:{{.Tag}}'")
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_each_node_pulls_the_pinned_digest_from_the_registry_then_nothing_to_change(
    ctr, reg, capsys, tmp_path
):
    info, settings, _base, image = ctr
    ref, want = f"{reg}/team/np-lab:1", archive.read(image).id
    for i in range(NODES):
        assert _ssh(ctr, i, "podman rmi -a -f >/dev/null 2>&1; true").returncode == 0
    sets = (f"container_image={ref}", "container_fetch=registry")
    rc, report, _ = provision(info, settings, capsys, *sets)
    assert rc == 0, _failed(report)
    for i, node in enumerate(("worker-0", "worker-1")):
        pulled = [s for s in steps_of(report, node) if "pulled: " in s["step"]]
        assert pulled and pulled[0]["status"] == "changed", steps_of(report, node)
        assert f"{want} {ref}" in _held(ctr, i)  # the ID the registry names, under its name
        assert not report["nodes"][node].get("container_image")  # no archive went to it
    rc, report, _ = provision(info, settings, capsys, *sets)
    assert rc == 0 and report["changed"] == 0, report
    # verify-parity compares the nodes against the pin provision gave them
    got = parity(info, settings, capsys, ref, tmp_path)
    assert drift_of(got, "container.image") is None, got["drift"]
    assert _ssh(ctr, 1, f"podman rmi -f {want} >/dev/null").returncode == 0
    got = parity(info, settings, capsys, ref, tmp_path)
    groups = {g["value"]: g["nodes"] for g in drift_of(got, "container.image") or []}
    assert groups == {want: ["worker-0"], "missing": ["worker-1"]}, got["drift"]


def test_a_moved_tag_reaches_every_node_through_the_relay(ctr, reg, capsys):
    """The tag now names another image: the controller pins the new digest, copies it once
    with skopeo into an archive, and the nodes load that; the old image is not "nothing to
    change"."""
    info, settings, base, _image = ctr
    ref = f"{reg}/team/np-lab:1"
    root = images.base_root()
    other = images.docker_archive(
        root, base / "np-lab-2.tar", "localhost/np-lab:2", env={"PATH": "/usr/bin:/bin"}
    )
    labreg.push(other, ref)
    want = archive.read(other).id
    rc, report, _ = provision(info, settings, capsys, f"container_image={ref}")
    assert rc == 0, _failed(report)
    for i, node in enumerate(("worker-0", "worker-1")):
        assert any(s["status"] == "changed" for s in steps_of(report, node)), report
        assert f"{want} {ref}" in _held(ctr, i)
    kept = Path(settings.state) / "images" / f"{want.split(':')[1]}.docker.tar"
    assert archive.read(kept).id == want  # skopeo's copy, kept for the next run
    rc, report, _ = provision(info, settings, capsys, f"container_image={ref}")
    assert rc == 0 and report["changed"] == 0, report


def test_a_reference_the_registry_lacks_is_one_line_naming_the_variable(ctr, reg, capsys):
    info, settings, _base, _image = ctr
    opts = ProvisionOptions(
        inventory=str(info.inventory),
        roles="container",
        sets=(f"container_image={reg}/team/absent:1",),
    )
    assert api.provision(opts, settings) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("error: ") and "container_image" in err[0], err
    assert f"{reg}/team/absent:1" in err[0] and "skopeo inspect failed" in err[0], err
