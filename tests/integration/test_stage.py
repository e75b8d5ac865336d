"""`invoke stage` on the lab's 3 nodes through real sshd and the mesh the site put in place
(issue 48): a 2 GB dataset chained node to node, interrupted by Ctrl-C and resumed (only what
was missing moves), every file's sha256 the source's, a third run that moves nothing; shards by
rank; a file changed on a node behind nodeprep's back sent again; node to node with the
controller sending nothing; a node short of room named before anything moves; `train --stage`
putting each rank's shard on its node before launch."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from nodeprep import cli as api
from nodeprep.commands import stage as stage_cmd
from nodeprep.commands.options import StageOptions, TrainOptions
from nodeprep.engine.events import Events
from nodeprep.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
MB = 1 << 20
DEST = "scratch/stage-2g"


def _sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(8 * MB):
            h.update(block)
    return h.hexdigest()


def _files(root: Path) -> dict[str, Path]:
    return {
        str(p.relative_to(root)): p
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".nodeprep-stage" not in p.relative_to(root).parts
    }


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, lab) -> Path:
    """2 GiB: two 768 MiB files and eight of 64 MiB, random bytes; removed after the module,
    with what the tests staged on the nodes (8 GiB in all: a CI disk is not endless)."""
    root = tmp_path_factory.mktemp("dataset")
    yield _made(root)
    shutil.rmtree(root, ignore_errors=True)
    for node in lab.nodes:
        shutil.rmtree(node.home / "scratch", ignore_errors=True)


def _made(root: Path) -> Path:
    (root / "shards").mkdir()
    for name, size in [("big-0.bin", 768), ("big-1.bin", 768)] + [
        (f"shards/s{i}.bin", 64) for i in range(8)
    ]:
        subprocess.run(
            ["head", "-c", str(size * MB), "/dev/urandom"],
            stdout=open(root / name, "wb"),  # noqa: SIM115 -- closed with the process
            check=True,
        )
    return root


def _stage(lab, settings, src, dest, **kw):
    opts = StageOptions(inventory=str(lab.inventory), src=str(src), dest=dest, **kw)
    return stage_cmd.stage(opts, settings, Events()).stages[0]


def _journals(home: Path) -> int:
    """Verified chunks of interrupted files under the node's DEST."""
    parts = home / DEST / ".nodeprep-stage" / "parts"
    return sum(len(j.read_text().splitlines()) - 1 for j in parts.glob("*.j"))


def _running() -> str:
    return subprocess.run(["pgrep", "-af", "stagerecv-"], capture_output=True, text=True).stdout


def _interrupted(lab, settings, src: Path) -> tuple[int, str]:
    """`invoke stage` as a process, Ctrl-C once the chain's last node holds 3 verified
    chunks: (its exit status, its output)."""
    env = dict(
        os.environ,
        INVOKE_NODEPREP_STATE_DIR=settings.state_dir,
        INVOKE_NODEPREP_LAB_ROOT=settings.lab_root,
    )
    argv = [str(ROOT / ".venv" / "bin" / "invoke"), "stage", str(src), f"~/{DEST}"]
    argv += ["--inventory", str(lab.inventory)]
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(proc.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and _journals(lab.nodes[2].home) < 3:
        assert proc.poll() is None, "".join(seen)
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    proc.wait(30)
    reader.join(5)
    return proc.returncode, "".join(seen)


def test_two_gb_chained_interrupted_resumed_then_nothing(provisioned, lab, lab_settings, dataset):
    code, text = _interrupted(lab, lab_settings, dataset)
    assert code == 130, text[-3000:]
    deadline = time.monotonic() + 10  # the chain winds down as each hop's stdin ends
    while time.monotonic() < deadline and _running():
        time.sleep(0.2)
    assert _running() == "", _running()  # nothing of the stage runs on any node
    for node in lab.nodes:
        got = _files(node.home / DEST)
        assert all(p.stat().st_size == (dataset / rel).stat().st_size for rel, p in got.items())
        work = [p for p in (node.home / ".nodeprep").glob("stage-*") if p.is_dir()]
        assert work == [], f"working files left on {node.name}: {work}"
    total = sum(p.stat().st_size for p in _files(dataset).values())

    res = _stage(lab, lab_settings, dataset, f"~/{DEST}")
    assert [n.status for n in res.nodes] == ["staged"] * 3, res.as_dict()
    assert res.chained and [n.via for n in res.nodes] == ["controller", "worker-0", "worker-1"]
    assert 0 < res.sent_here < total - 2 * 64 * MB, res.as_dict()  # only what was missing
    want = {rel: _sha(p) for rel, p in _files(dataset).items()}
    for node in lab.nodes:
        got = _files(node.home / DEST)
        assert {rel: _sha(p) for rel, p in got.items()} == want, node.name
        assert (node.home / DEST / "big-0.bin").stat().st_mtime_ns == (
            dataset / "big-0.bin"
        ).stat().st_mtime_ns
    inodes = {n.name: (n.home / DEST / "big-1.bin").stat().st_ino for n in lab.nodes}

    again = _stage(lab, lab_settings, dataset, f"~/{DEST}")
    assert [n.status for n in again.nodes] == ["unchanged"] * 3 and again.sent_here == 0
    assert {n.name: (n.home / DEST / "big-1.bin").stat().st_ino for n in lab.nodes} == inodes


def test_shards_by_rank_a_changed_file_resent_node_to_node(provisioned, lab, lab_settings, dataset):
    src = dataset / "shards"
    names = sorted(_files(src))
    res = _stage(lab, lab_settings, src, "~/scratch/shards", shard=True)
    assert [n.status for n in res.nodes] == ["staged"] * 3 and not res.chained
    for r, node in enumerate(lab.nodes):
        assert sorted(_files(node.home / "scratch" / "shards")) == names[r::3], node.name

    # a byte changed on worker-1 with its size and mtime put back: the ctime gives it away
    victim = lab.nodes[1].home / "scratch" / "shards" / names[1]
    st = victim.stat()
    with open(victim, "r+b") as fh:
        fh.write(b"\0" if fh.read(1) != b"\0" else b"\1")
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    res = _stage(lab, lab_settings, src, "~/scratch/shards", shard=True)
    assert {n.node: (n.status, n.files) for n in res.nodes} == {
        "worker-0": ("unchanged", 0),
        "worker-1": ("staged", 1),
        "worker-2": ("unchanged", 0),
    }
    assert _sha(victim) == _sha(src / names[1])

    # node to node: worker-0's full copy to the others, the controller sending nothing
    _stage(lab, lab_settings, src, "~/scratch/full", limit="worker-0")
    res = _stage(
        lab, lab_settings, "~/scratch/full", "~/scratch/copy", from_node="worker-0",
        limit="worker-[1-2]",
    )  # fmt: skip
    assert [n.status for n in res.nodes] == ["staged", "staged"] and res.sent_here == 0
    assert [n.via for n in res.nodes] == ["worker-0", "worker-1"]
    for node in lab.nodes[1:]:
        got = _files(node.home / "scratch" / "copy")
        assert {k: _sha(p) for k, p in got.items()} == {k: _sha(p) for k, p in _files(src).items()}


def test_a_node_short_of_room_is_named_before_anything_moves(
    provisioned, lab, lab_settings, dataset
):
    """worker-2's ~/tiny is a 32 MiB tmpfs in its own mount namespace: the stage of 128 MiB is
    refused with worker-2 and both numbers, exit 2, and no node got any of its data (each
    holds DEST's identity only, made when it was read)."""
    node = lab.nodes[2]
    uid = (node.home).stat().st_uid
    mount = ["nsenter", "-t", str(node.sshd_pid), "-m"]
    subprocess.run(
        [*mount, "sh", "-c", f"mkdir -p /home/{lab.user}/tiny && "
         f"mount -t tmpfs -o size=32m,uid={uid} tmpfs /home/{lab.user}/tiny"],
        check=True,
    )  # fmt: skip
    try:
        src = dataset / "shards"
        with pytest.raises(InputError) as err:
            _stage(lab, lab_settings, src, "~/tiny/data", limit="worker-[0-2]")
        said = str(err.value)
        assert err.value.exit_code == 2 and "not enough room on 1 node(s)" in said, said
        assert "worker-2 needs 512.0 MiB, has 32.0 MiB free" in said, said
        for n in lab.nodes[:2]:  # DEST's identity is made (.nodeprep-stage/id), no data
            assert _files(n.home / "tiny" / "data") == {}, n.name
            assert not list((n.home / "tiny" / "data").rglob("parts/*")), n.name
        listed = subprocess.run(
            [*mount, "find", f"/home/{lab.user}/tiny", "-name", "s*.bin"],
            capture_output=True,
            text=True,
        )
        assert listed.stdout == ""  # nor worker-2, in the tmpfs only it sees
    finally:
        subprocess.run([*mount, "umount", f"/home/{lab.user}/tiny"], check=False)


def test_train_stage_puts_each_ranks_shard_on_its_node_before_launch(
    provisioned, lab, lab_settings, dataset, tmp_path, capfd
):
    inv = tmp_path / "hosts.yml"
    text = lab.inventory.read_text()
    rel = os.path.relpath(dataset / "shards", tmp_path)  # relative to the inventory file
    stages = f"  stages:\n    shards: {{src: {rel}, dest: ~/scratch/job-shards, shard: true}}\n"
    inv.write_text(text.replace("vars:\n", "vars:\n" + stages, 1))
    script = tmp_path / "job" / "ls_shards.py"
    script.parent.mkdir()
    script.write_text(
        "import os\n"
        "names = sorted(os.listdir(os.path.expanduser('~/scratch/job-shards')))\n"
        "names = [n for n in names if not n.startswith('.')]\n"
        "print('rank', os.environ['RANK'], 'has', ','.join(names), flush=True)\n"
    )
    code = api.train(
        TrainOptions(
            inventory=str(inv),
            limit="worker-[0-1]",
            launcher="torchrun",
            payload=str(script),
            timeout=120,
            stages=("shards",),
        ),
        lab_settings,
    )
    out = capfd.readouterr()
    said = out.out + out.err
    assert code == 0, said[-3000:]
    names = sorted(_files(dataset / "shards"))
    assert f"rank 0 has {','.join(names[0::2])}" in said, said[-3000:]
    assert f"rank 1 has {','.join(names[1::2])}" in said, said[-3000:]
