"""nodeside/stage.py (scan, send) and stagerecv.py (recv, state) run as the programs they are,
on files here: what a node's end of a stage does with a whole stream, one cut short, a chunk
that does not match its sum, a path that leaves the destination, a file changed behind its
back, and the bytes a chain passes on."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nodeprep import nodeside
from nodeprep.ops.stage.needs import Entry, Manifest

CHUNK = 1 << 16  # small chunks: a few per file


def _run(*args, stdin: bytes = b"") -> subprocess.CompletedProcess:
    prog = nodeside.STAGE if args[0] in ("scan", "send") else nodeside.STAGERECV
    argv = [sys.executable, "-I", "-S", str(prog), *map(str, args)]
    return subprocess.run(argv, input=stdin, capture_output=True)


@pytest.fixture()
def src(tmp_path) -> Path:
    root = tmp_path / "src"
    (root / "sub" / "deep").mkdir(parents=True)
    (root / "big.bin").write_bytes(os.urandom(5 * CHUNK + 123))
    (root / "sub" / "a.txt").write_text("alpha\n")
    (root / "sub" / "deep" / "empty").write_bytes(b"")
    (root / "name with spaces").write_text("x")
    return root


def _scan(src: Path, tmp_path: Path) -> Manifest:
    r = _run("scan", src, CHUNK, tmp_path / "cache.json")
    assert r.returncode == 0, r.stderr
    return Manifest.parse(json.loads(r.stdout))


def _stream(src: Path, tmp_path: Path, manifest: Manifest, only=None, force=False) -> bytes:
    req = [
        [e.path, e.size, e.mtime, CHUNK, list(e.sums), list(range(len(e.sums))), e.mode, force]
        for e in manifest.entries
        if only is None or e.path in only
    ]
    (tmp_path / "req.json").write_text(json.dumps(req))
    r = _run("send", src, tmp_path / "req.json")
    assert r.returncode == 0, r.stderr
    return r.stdout


def _state(dest: Path) -> dict:
    r = _run("state", dest)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _same(a: Path, b: Path) -> bool:
    def files(root):
        return {
            str(p.relative_to(root)): p.read_bytes()
            for p in root.rglob("*")
            if p.is_file() and ".nodeprep-stage" not in p.parts
        }

    return files(a) == files(b)


def test_scan_lists_every_file_with_chunk_sums_as_sha256_says(src, tmp_path):
    m = _scan(src, tmp_path)
    paths = [e.path for e in m.entries]
    assert sorted(paths) == ["big.bin", "name with spaces", "sub/a.txt", "sub/deep/empty"]
    big = next(e for e in m.entries if e.path == "big.bin")
    data = (src / "big.bin").read_bytes()
    assert list(big.sums) == [
        hashlib.sha256(data[i : i + CHUNK]).hexdigest() for i in range(0, len(data), CHUNK)
    ]
    empty = next(e for e in m.entries if e.path == "sub/deep/empty")
    assert empty.sums == (hashlib.sha256(b"").hexdigest(),)


def test_a_file_changed_with_its_size_and_mtime_kept_is_hashed_again(src, tmp_path):
    """The cache is keyed by size, mtime, inode and ctime: a rewrite that puts the mtime back
    still changes the ctime, so the new content's sums are listed."""
    first = {e.path: e for e in _scan(src, tmp_path).entries}
    st = (src / "sub" / "a.txt").stat()
    (src / "sub" / "a.txt").write_text("ALPHA\n")
    os.utime(src / "sub" / "a.txt", ns=(st.st_atime_ns, st.st_mtime_ns))
    again = {e.path: e for e in _scan(src, tmp_path).entries}
    assert again["sub/a.txt"].sums != first["sub/a.txt"].sums
    assert again["big.bin"].sums == first["big.bin"].sums


def test_a_missing_source_is_named(tmp_path):
    r = _run("scan", tmp_path / "nope", CHUNK, tmp_path / "c.json")
    assert r.returncode == 3 and b"nope: no such file or directory" in r.stderr


def test_a_whole_stream_lands_every_file_with_its_mtime_and_a_record(src, tmp_path):
    m = _scan(src, tmp_path)
    dest = tmp_path / "dest"
    r = _run("recv", dest, "n0", stdin=_stream(src, tmp_path, m))
    assert r.returncode == 0, r.stderr
    assert _same(src, dest)
    assert (dest / "big.bin").stat().st_mtime_ns == (src / "big.bin").stat().st_mtime_ns
    st = _state(dest)
    assert {p: v[2] for p, v in st["record"].items()} == {e.path: e.digest for e in m.entries}
    assert st["parts"] == {} and st["free"] > 0
    assert b"@@staged n0 4 " in r.stderr


def test_a_stream_cut_short_keeps_the_verified_chunks_and_the_rest_completes_it(src, tmp_path):
    m = _scan(src, tmp_path)
    dest = tmp_path / "dest"
    stream = _stream(src, tmp_path, m, only={"big.bin"})
    r = _run("recv", dest, "n0", stdin=stream[: 3 * CHUNK + 500])
    assert r.returncode == 1 and b"the stream ended early" in r.stderr
    st = _state(dest)
    assert st["record"] == {} and not (dest / "big.bin").exists()  # nothing half-written
    big = next(e for e in m.entries if e.path == "big.bin")
    (digest, size, have) = st["parts"]["big.bin"]
    assert digest == big.digest and size == big.size and have == [0, 1]
    rest = [i for i in range(len(big.sums)) if i not in have]
    req = [[big.path, big.size, big.mtime, CHUNK, list(big.sums), rest, big.mode, False]]
    (tmp_path / "rest.json").write_text(json.dumps(req))
    tail = _run("send", src, tmp_path / "rest.json").stdout
    assert len(tail) < len(stream) - 2 * CHUNK  # only what was missing travels
    assert _run("recv", dest, "n0", stdin=tail).returncode == 0
    assert (dest / "big.bin").read_bytes() == (src / "big.bin").read_bytes()
    assert _state(dest)["parts"] == {}


def test_a_chunk_that_does_not_match_its_sum_is_not_kept(src, tmp_path):
    m = _scan(src, tmp_path)
    dest = tmp_path / "dest"
    stream = bytearray(_stream(src, tmp_path, m, only={"big.bin"}))
    stream[-CHUNK // 2] ^= 0xFF  # a byte of the last full chunk's data, flipped on the way
    r = _run("recv", dest, "n0", stdin=bytes(stream))
    assert r.returncode == 1 and b"does not match its checksum; not kept" in r.stderr
    assert not (dest / "big.bin").exists()
    assert len(_state(dest)["parts"]["big.bin"][2]) == 5  # of 6: the bad one is missing


def test_a_path_leaving_the_destination_is_refused(tmp_path):
    head = {"p": "../escape", "s": 1, "m": 0, "c": CHUNK, "i": 0}
    head["hs"] = [hashlib.sha256(b"x").hexdigest()]
    text = json.dumps(head).encode()
    stream = b"%010d" % len(text) + text + b"x" + b"0" * 10
    r = _run("recv", tmp_path / "dest", "n0", stdin=stream)
    assert r.returncode == 1 and b"refusing the path '../escape'" in r.stderr
    assert not (tmp_path / "escape").exists()


def test_a_file_changed_on_the_node_is_no_longer_vouched_for(src, tmp_path):
    """state trusts a record entry only while the file's size, inode and ctime are as
    recorded; a scan of the destination with no cache (what --verify runs) reads every file."""
    m = _scan(src, tmp_path)
    dest = tmp_path / "dest"
    assert _run("recv", dest, "n0", stdin=_stream(src, tmp_path, m)).returncode == 0
    with open(dest / "sub" / "a.txt", "r+") as fh:
        fh.write("A")  # same size; the ctime moves
    assert "sub/a.txt" not in _state(dest)["record"] and "big.bin" in _state(dest)["record"]
    r = _run("scan", dest, CHUNK, "-")
    there = {e.path: e.digest for e in Manifest.parse(json.loads(r.stdout)).entries}
    want = {e.path: e.digest for e in m.entries}
    assert there["sub/a.txt"] != want["sub/a.txt"] and there["big.bin"] == want["big.bin"]
    assert set(there) == set(want)  # the destination's own directory is not listed


def test_a_chain_node_passes_on_every_byte_it_reads(src, tmp_path):
    m = _scan(src, tmp_path)
    stream = _stream(src, tmp_path, m)
    nxt = tmp_path / "next"
    nxt.write_bytes(b"")
    r = _run("recv", tmp_path / "dest", "n0", nxt, stdin=stream)
    assert r.returncode == 0, r.stderr
    assert nxt.read_bytes() == stream
    assert _same(src, tmp_path / "dest")


def test_what_a_node_already_holds_is_passed_on_not_written_again(src, tmp_path):
    m = _scan(src, tmp_path)
    dest = tmp_path / "dest"
    stream = _stream(src, tmp_path, m)
    assert _run("recv", dest, "n0", stdin=stream).returncode == 0
    ino = (dest / "big.bin").stat().st_ino
    assert _run("recv", dest, "n0", stdin=stream).returncode == 0
    assert (dest / "big.bin").stat().st_ino == ino  # not replaced


def test_the_controllers_digest_is_the_programs(src, tmp_path):
    m = _scan(src, tmp_path)
    dest = tmp_path / "dest"
    _run("recv", dest, "n0", stdin=_stream(src, tmp_path, m))
    got = _state(dest)["record"]
    assert all(got[e.path][2] == Entry(e.path, e.size, e.mtime, e.sums).digest for e in m.entries)


def test_forced_frames_replace_a_file_the_record_still_vouches_for(src, tmp_path):
    """--verify found the node's copy bad while its size, inode and ctime are as recorded
    (bit rot): frames marked "f" are written, not passed over."""
    m = _scan(src, tmp_path)
    dest = tmp_path / "dest"
    assert _run("recv", dest, "n0", stdin=_stream(src, tmp_path, m)).returncode == 0
    ino = (dest / "big.bin").stat().st_ino
    assert _run("recv", dest, "n0", stdin=_stream(src, tmp_path, m, force=True)).returncode == 0
    assert (dest / "big.bin").stat().st_ino != ino  # written again, renamed into place
    assert (dest / "big.bin").read_bytes() == (src / "big.bin").read_bytes()


def test_a_part_whose_chunks_are_all_there_is_finished_by_any_chunk_of_it(src, tmp_path):
    """Every chunk journalled but the rename never happened (killed, or it failed): the state
    lists it as a part; its last chunk sent again puts it in place."""
    m = _scan(src, tmp_path)
    dest = tmp_path / "dest"
    (dest / "big.bin").mkdir(parents=True)  # in the way: the rename fails
    r = _run("recv", dest, "n0", stdin=_stream(src, tmp_path, m, only={"big.bin"}))
    assert r.returncode == 1 and b"big.bin: cannot put it in place" in r.stderr
    assert len(_state(dest)["parts"]["big.bin"][2]) == 6  # all verified, not in place
    (dest / "big.bin").rmdir()
    big = next(e for e in m.entries if e.path == "big.bin")
    req = [[big.path, big.size, big.mtime, CHUNK, list(big.sums), [5], big.mode, False]]
    (tmp_path / "last.json").write_text(json.dumps(req))
    tail = _run("send", src, tmp_path / "last.json").stdout
    assert _run("recv", dest, "n0", stdin=tail).returncode == 0
    assert (dest / "big.bin").read_bytes() == (src / "big.bin").read_bytes()
    assert "big.bin" in _state(dest)["record"] and _state(dest)["parts"] == {}


def test_modes_travel_and_every_node_seeing_one_directory_sees_one_identity(src, tmp_path):
    (src / "sub" / "a.txt").chmod(0o750)
    m = _scan(src, tmp_path)
    dest = tmp_path / "dest"
    assert _run("recv", dest, "n0", stdin=_stream(src, tmp_path, m)).returncode == 0
    assert (dest / "sub" / "a.txt").stat().st_mode & 0o777 == 0o750
    assert (dest / "big.bin").stat().st_mode & 0o777 == (src / "big.bin").stat().st_mode & 0o777
    first, again = _state(dest)["id"], _state(dest)["id"]
    assert first and first == again and _state(tmp_path / "other")["id"] != first
