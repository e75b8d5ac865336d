"""What a sync moves to a node (ops/sync/manifest.py), decided as data: unchanged files never
read, a touched file not sent, a changed one sent, deletions only of what the node got."""

from __future__ import annotations

from nodeprep.ops.sync import manifest

SHA = {"a.py": "1" * 64, "b.py": "2" * 64, "big.pt": "3" * 64, "new.py": "4" * 64}


def _reader(log: list):
    def sha_of(path: str) -> str:
        log.append(path)
        return SHA[path]

    return sha_of


def test_a_first_sync_sends_everything_and_records_it():
    read: list = []
    p = manifest.plan({"a.py": (3, 10), "big.pt": (10**10, 11)}, {}, _reader(read))
    assert p.send == ["a.py", "big.pt"] and p.delete == [] and p.hashed == []
    assert p.record == {"a.py": (3, 10, SHA["a.py"]), "big.pt": (10**10, 11, SHA["big.pt"])}


def test_a_second_sync_reads_no_unchanged_file_and_moves_nothing():
    record = {"a.py": (3, 10, SHA["a.py"]), "big.pt": (10**10, 11, SHA["big.pt"])}
    read: list = []
    p = manifest.plan({"a.py": (3, 10), "big.pt": (10**10, 11)}, record, _reader(read))
    assert p.nothing and read == [] and p.record == record


def test_touched_changed_new_and_gone():
    record = {
        "a.py": (3, 10, SHA["a.py"]),
        "b.py": (5, 10, "0" * 64),
        "gone.py": (1, 1, "9" * 64),
    }
    local = {"a.py": (3, 99), "b.py": (5, 12), "new.py": (7, 13)}  # a touched, b edited
    read: list = []
    p = manifest.plan(local, record, _reader(read))
    assert p.send == ["b.py", "new.py"] and p.delete == ["gone.py"]
    assert p.hashed == ["a.py", "b.py"] and read == ["a.py", "b.py", "new.py"]
    assert p.record["a.py"] == (3, 99, SHA["a.py"])  # touch: the new mtime, nothing moved
    assert "gone.py" not in p.record


def test_a_size_change_is_sent_even_if_a_hash_were_to_match():
    record = {"a.py": (4, 10, SHA["a.py"])}
    p = manifest.plan({"a.py": (3, 10)}, record, _reader([]))
    assert p.send == ["a.py"]
