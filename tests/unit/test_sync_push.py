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
    (job / ".x.py.nodeprep-part").write_text("half")  # an interrupted write: not listed
    record = {
        "a.py": [3, 100 * S, "1"],
        "sub/b c.py": [2, 200 * S + 5, "2"],
        "x.py": [9, 300 * S, "3"],
    }
    (job / push.RECORD).write_text(json.dumps(record))
    rec, on_node = push.parse_state(_listing(job))
    assert rec == {k: tuple(v) for k, v in record.items()}
    assert on_node["a.py"] == (3, 100) and on_node["sub/b c.py"] == (2, 200)
    assert ".x.py.nodeprep-part" not in on_node
    ok = push.verified(rec, on_node)
    assert sorted(ok) == ["a.py", "sub/b c.py"]  # x.py: 1 byte on the node, 9 recorded
    # a node that never got anything (no record, no directory yet): an empty record
    assert push.parse_state(_listing(tmp_path / "new"))[0] == {}


def _stream(head: dict, files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    buf.write((json.dumps(head) + "\n").encode())
    with tarfile.open(fileobj=buf, mode="w|", format=tarfile.PAX_FORMAT) as t:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o640
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _receive(job: Path, stream: bytes) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(nodeside.SYNCRECV), str(job)], input=stream, capture_output=True
    )


def test_the_receiver_puts_files_whole_deletes_what_it_was_told_and_writes_the_record(tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    (job / "old.py").write_text("gone")
    (job / "snapshot.pt").write_text("the job's own: never in a record, never touched")
    (job / "kept.py").write_text("kept")  # not sent: its mtime follows the record
    (job / ".stale.nodeprep-part").write_text("from an interrupted run")
    record = {"new/a.py": [3, 7 * S + 11, "s1"], "kept.py": [4, 9 * S, "s2"]}
    r = _receive(job, _stream({"delete": ["old.py"], "record": record}, {"new/a.py": b"abc"}))
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().strip() == "received 1 deleted 1"
    assert (job / "new" / "a.py").read_bytes() == b"abc"
    assert (job / "new" / "a.py").stat().st_mtime_ns == 7 * S + 11
    assert (job / "kept.py").stat().st_mtime_ns == 9 * S
    assert not (job / "old.py").exists() and (job / "snapshot.pt").exists()
    assert not list(job.rglob("*.nodeprep-part"))
    assert json.loads((job / push.RECORD).read_text()) == record


@pytest.mark.parametrize("bad", ["../escape.py", "/etc/x", "a/../../b"])
def test_the_receiver_refuses_a_path_outside_its_directory(tmp_path, bad):
    job = tmp_path / "job"
    r = _receive(job, _stream({"delete": [], "record": {}}, {bad: b"x"}))
    assert r.returncode != 0 and b"refusing the path" in r.stderr
    assert not (tmp_path / "escape.py").exists()
