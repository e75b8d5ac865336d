"""A project synced as git sees it (issue 48) to the lab's 3 nodes through real sshd: a generated
repository of 20,000 small files and a few large ones, with a .gitignore (negations, a nested
ignore file, an ignored checkpoint directory) and a .nodeprepignore. Exactly git's file set
arrives (`git ls-files --cached --others --exclude-standard`, less .nodeprepignore's); a second
sync moves nothing and reads no file here; an edit moves one file; a deletion is mirrored and
the job's own files on the node are kept; a file changed on a node behind nodeprep's back is
sent again. Then `train --payload` runs a script of that project, which counts the files it
sees beside itself."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from nodeprep import cli as api
from nodeprep.commands.options import TrainOptions
from nodeprep.engine.events import Events
from nodeprep.engine.fleet import Fleet
from nodeprep.inventory import model as inventory
from nodeprep.ops.sync import chained, fileset, push

JOB = "/home/nodeprep/.nodeprep/jobs/big"
SMALL = 20_000


def _git(root: Path, *args: str) -> str:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}
    env.update(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t")
    env.update(GIT_COMMITTER_EMAIL="t@t")
    return subprocess.run(
        ["git", *args], cwd=root, env=env, check=True, capture_output=True, text=True
    ).stdout


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("big")
    (root / ".gitignore").write_text("*.log\n!keep.log\ncheckpoints/\nwandb/\n__pycache__/\n")
    (root / ".nodeprepignore").write_text("docs/\n")
    for i in range(SMALL):
        d = root / "pkg" / f"m{i // 500:03d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i:05d}.py").write_text(f"X = {i}\n")
    (root / "pkg" / ".gitignore").write_text("*.tmp\n!keep.tmp\n")
    (root / "pkg" / "scratch.tmp").write_text("ignored by the nested file\n")
    (root / "pkg" / "keep.tmp").write_text("kept by the nested negation\n")
    (root / "keep.log").write_text("kept\n")
    (root / "debug.log").write_text("ignored\n")
    (root / "checkpoints").mkdir()
    (root / "checkpoints" / "step-1.pt").write_bytes(os.urandom(8 << 20))
    (root / "docs").mkdir()
    (root / "docs" / "guide.md").write_text("tracked, not for the nodes\n")
    for name in ("tokenizer.bin", "weights.bin"):
        (root / name).write_bytes(os.urandom(16 << 20))
    (root / "count.py").write_text(
        "import os\n"
        "here = os.path.dirname(os.path.abspath(__file__))\n"
        "n = sum(len(fs) for d, _, fs in os.walk(here))\n"
        "print(f'count: {n} files beside me', flush=True)\n"
    )
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "a project")
    (root / "untracked.py").write_text("not yet added: git would track it\n")
    return root


def _want(root: Path) -> list[str]:
    listed = _git(root, "ls-files", "--cached", "--others", "--exclude-standard").split("\n")
    return sorted(p for p in listed if p and not p.startswith("docs/"))


def _sync(lab, settings, root: Path, hashes=None):
    files = {rel: root / rel for rel in fileset.of(root).files}
    how = push.How(hashes or push.Hashes())  # one for the sync: its nodes share it
    inv = inventory.load(str(lab.inventory))
    with Fleet(inv.hosts[:3], settings, "sync-test", Events()) as fleet:
        try:
            got = fleet.map(lambda s: push.push(s, files, JOB, how), "sync")
        finally:
            how.close()
        assert not fleet.unusable(), fleet.unusable()
    return got


def _on_node(lab_ssh, node: int, cmd: str) -> str:
    r = lab_ssh(node, cmd, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_exactly_gits_files_arrive_then_nothing_then_one(lab, lab_settings, lab_ssh, project):
    for i in range(3):
        _on_node(lab_ssh, i, f"rm -rf {JOB}")
    want = _want(project)
    assert len(want) > SMALL and "checkpoints/step-1.pt" not in want
    t0 = time.monotonic()
    first = _sync(lab, lab_settings, project)
    took = time.monotonic() - t0
    for i in range(3):
        listed = _on_node(
            lab_ssh, i, f"cd {JOB} && find . -type f ! -name {push.RECORD} -printf '%P\\n'"
        )
        assert sorted(listed.split()) == want, f"worker-{i}"
    assert all(sorted(p.sent) == want for p in first.values())
    assert took < 120, took  # 20,000 files to 3 nodes: a stream each, no round trip per file

    hashes = push.Hashes()
    again = _sync(lab, lab_settings, project, hashes)  # nothing changed: nothing read here
    assert all(not p.sent and not p.deleted and not p.hashed for p in again.values())
    assert hashes.done == {}

    (project / "pkg" / "m000" / "f00001.py").write_text("X = 'edited'\n")
    os.utime(project / "tokenizer.bin")  # touched: read here once, not sent
    one = _sync(lab, lab_settings, project, hashes)
    assert all(p.sent == ["pkg/m000/f00001.py"] for p in one.values()), one
    assert len(hashes.done) == 2  # read once for the three nodes
    got = _on_node(lab_ssh, 1, f"cat {JOB}/pkg/m000/f00001.py")
    assert got == "X = 'edited'\n"


def test_deletions_are_mirrored_and_the_jobs_own_files_kept(lab, lab_settings, lab_ssh, project):
    _sync(lab, lab_settings, project)
    _on_node(lab_ssh, 0, f"echo mine > {JOB}/snapshot.pt")  # the job's own: never synced
    (project / "untracked.py").unlink()
    _on_node(lab_ssh, 2, f"echo tampered > {JOB}/keep.log")  # behind nodeprep's back
    got = _sync(lab, lab_settings, project)
    assert all(p.deleted == ["untracked.py"] for p in got.values()), got
    assert got["worker-2"].sent == ["keep.log"] and not got["worker-0"].sent
    assert _on_node(lab_ssh, 2, f"cat {JOB}/keep.log") == "kept\n"
    left = _on_node(lab_ssh, 0, f"ls {JOB}/untracked.py {JOB}/snapshot.pt 2>&1 || true")
    assert "snapshot.pt" in left and "No such file" in left


def test_train_runs_a_script_of_the_project(provisioned, lab, lab_settings, project, capfd):
    code = api.train(
        TrainOptions(
            inventory=str(lab.inventory),
            limit="worker-[0-1]",
            launcher="torchrun",
            payload=str(project / "count.py"),
            timeout=120,
        ),
        lab_settings,
    )
    out = capfd.readouterr()
    text = out.out + out.err
    assert code == 0, text[-3000:]
    n = len(_want(project)) + 1  # and the record
    assert f"count: {n} files beside me" in text, text[-3000:]


def test_a_first_sync_to_three_homes_goes_through_one_chain(
    provisioned, lab, lab_settings, lab_ssh, project
):
    """Three empty homes would get the same: the controller feeds worker-0 alone and the stream
    goes on node to node over the mesh; each node then holds exactly git's files with the
    record, so the per-node sync after it moves nothing."""
    chain_dir = "/home/nodeprep/.nodeprep/jobs/chained"
    for i in range(3):
        _on_node(lab_ssh, i, f"rm -rf {chain_dir}")
    files = {rel: project / rel for rel in fileset.of(project).files}
    how = push.How()
    inv = inventory.load(str(lab.inventory))
    with Fleet(inv.hosts[:3], lab_settings, "sync-test", Events()) as fleet:
        try:
            fanned = chained.fan_out(fleet, list(fleet.sessions), files, lambda n: chain_dir, how)
            after = fleet.map(
                lambda s: push.push(s, files, chain_dir, how, fanned.look(s.name)), "sync"
            )
        finally:
            how.close()
        assert not fleet.unusable(), fleet.unusable()
    tried = fanned.chained
    assert sorted(tried) == ["worker-0", "worker-1", "worker-2"]
    assert all(sorted(p.sent) == sorted(files) for p in tried.values())
    assert all(not p.sent and not p.deleted for p in after.values()), after  # all there
    want = _want(project)
    for i in range(3):
        listed = _on_node(
            lab_ssh, i, f"cd {chain_dir} && find . -type f ! -name {push.RECORD} -printf '%P\\n'"
        )
        assert sorted(listed.split()) == want, f"worker-{i}"
        left = _on_node(lab_ssh, i, "ls -a ~/.nodeprep | grep -c '^sync-\\|^relay-' || true")
        assert left.strip() == "0", f"worker-{i}: the chain's working files are left"
