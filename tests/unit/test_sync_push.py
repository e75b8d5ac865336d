"""A project sync's two ends without ssh (ops/sync/push.py, nodeside/syncrecv.py): the node's
listing script run for real by sh on a directory here and parsed, the record checked against
it; the receiver run for real by python3 on a stream made as push makes it. The whole sync
through sshd is lab-tested (tests/integration/test_sync.py)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from nodeprep import nodeside
from nodeprep.nodeside import syncrecv
from nodeprep.ops.sync import push

S = 1_000_000_000


def test_the_record_name_is_the_receivers():
    assert push.RECORD == syncrecv.RECORD


def _listing(job: Path) -> str:
    return subprocess.run(
        ["sh", "-c", push.state_script(str(job))], capture_output=True, text=True, check=True
    ).stdout


def test_the_nodes_listing_is_parsed_and_a_file_changed_there_is_not_trusted(tmp_path):
    job = tmp_path / "job dir"
    (job / "sub").mkdir(parents=True)
    for rel, text, mtime in (("a.py", "aaa", 100), ("sub/b c.py", "bb", 200), ("x.py", "x", 300)):
        (job / rel).write_text(text)
        os.utime(job / rel, ns=(mtime * S, mtime * S))
    (job / ".nodeprep-sync.part").mkdir()  # an interrupted sync's staging: not listed
    (job / ".nodeprep-sync.part" / "x.py").write_text("half")
    record = {
        "a.py": [3, 100 * S, "1"],
        "sub/b c.py": [2, 200 * S + 5, "2"],
        "x.py": [9, 300 * S, "3"],
    }
    (job / push.RECORD).write_text(json.dumps(record))
    rec, on_node = push.parse_state(_listing(job))
    assert rec == {k: tuple(v) for k, v in record.items()}
    assert on_node["a.py"] == (3, 100) and on_node["sub/b c.py"] == (2, 200)
    assert not [p for p in on_node if p.startswith(".nodeprep-sync.part")], on_node
    ok = push.verified(rec, on_node)
    assert sorted(ok) == ["a.py", "sub/b c.py"]  # x.py: 1 byte on the node, 9 recorded
    # a node that never got anything (no record, no directory yet): an empty record
    assert push.parse_state(_listing(tmp_path / "new"))[0] == {}


def _stream(head: dict, files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    body = json.dumps(head).encode()
    buf.write(b"%016d\n" % len(body) + body)
    with tarfile.open(fileobj=buf, mode="w|", format=tarfile.PAX_FORMAT) as t:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o640
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _receive(job: Path, stream: bytes, tar: bool = True) -> subprocess.CompletedProcess:
    """syncrecv.py run for real; TAR false: on a node without tar (Python's tarfile unpacks)."""
    env = {**os.environ, **({} if tar else {"PATH": "/nonexistent"})}
    return subprocess.run(
        [sys.executable, str(nodeside.SYNCRECV), str(job)],
        input=stream,
        capture_output=True,
        env=env,
    )


@pytest.mark.parametrize("tar", [True, False], ids=["gnu-tar", "tarfile"])
def test_the_receiver_puts_files_whole_deletes_what_it_was_told_and_writes_the_record(
    tmp_path, tar
):
    job = tmp_path / "job"
    job.mkdir()
    (job / "old.py").write_text("gone")
    (job / "snapshot.pt").write_text("the job's own: never in a record, never touched")
    (job / "kept.py").write_text("kept")  # not sent: its mtime follows the record
    (job / ".nodeprep-sync.part").mkdir()
    (job / ".nodeprep-sync.part" / "stale.py").write_text("from an interrupted run")
    record = {"new/a.py": [3, 7 * S + 11, "s1"], "kept.py": [4, 9 * S, "s2"]}
    stream = _stream({"delete": ["old.py"], "record": record}, {"new/a.py": b"abc"})
    r = _receive(job, stream, tar)
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().strip() == "received 1 deleted 1"
    assert (job / "new" / "a.py").read_bytes() == b"abc"
    assert (job / "new" / "a.py").stat().st_mtime_ns // S == 7  # the tar header's mtime
    assert (job / "kept.py").stat().st_mtime_ns == 9 * S
    assert not (job / "old.py").exists() and (job / "snapshot.pt").exists()
    assert not (job / ".nodeprep-sync.part").exists() and not (job / "stale.py").exists()
    assert json.loads((job / push.RECORD).read_text()) == record


@pytest.mark.parametrize("tar", [True, False], ids=["gnu-tar", "tarfile"])
@pytest.mark.parametrize("bad", ["../escape.py", "a/../../escape.py", "/tmp/escape.py"])
def test_the_receiver_writes_nothing_outside_its_directory(tmp_path, bad, tar):
    job = tmp_path / "deep" / "job"
    _receive(job, _stream({"delete": [], "record": {}}, {bad: b"x"}), tar)
    assert not (tmp_path / "deep" / "escape.py").exists()
    assert not (tmp_path / "escape.py").exists() and not Path("/tmp/escape.py").exists()
