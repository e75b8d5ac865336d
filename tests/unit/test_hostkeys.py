"""The project known_hosts store: record on first contact, refuse a change, pin/forget."""

import subprocess

import paramiko
import pytest

from nodeprep.engine import hostkeys


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    for i in range(2):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / f"k{i}")], check=True
        )
    return [paramiko.Ed25519Key.from_private_key_file(str(d / f"k{i}")) for i in range(2)]


def test_host_entry_format():
    assert hostkeys.host_entry("10.0.0.1", 22) == "10.0.0.1"
    assert hostkeys.host_entry("10.0.0.1", 2222) == "[10.0.0.1]:2222"


def test_record_then_changed_key_refused(tmp_path, keys):
    store = hostkeys.PinnedHostKeys(tmp_path / "kh")
    assert store.record("[10.0.0.1]:2222", keys[0]) is True
    assert store.record("[10.0.0.1]:2222", keys[0]) is False
    with pytest.raises(hostkeys.HostKeyChanged):
        store.record("[10.0.0.1]:2222", keys[1])
    assert store.lookup("10.0.0.1", 2222) == {"ssh-ed25519": keys[0]}
    assert (tmp_path / "kh").stat().st_mode & 0o777 == 0o600


def test_pin_replaces_and_forget_removes(tmp_path, keys):
    store = hostkeys.PinnedHostKeys(tmp_path / "kh")
    store.record("a", keys[0])
    store.record("b", keys[0])
    assert store.pin("a", keys[1]) is True
    assert store.pin("a", keys[1]) is False
    assert store.lookup("a") == {"ssh-ed25519": keys[1]}
    assert store.lookup("b") == {"ssh-ed25519": keys[0]}
    assert store.forget("a") == 1
    assert store.lookup("a") == {}


def test_policy_records_or_refuses(tmp_path, keys):
    store = hostkeys.PinnedHostKeys(tmp_path / "kh")
    seen = []
    hostkeys.PinningPolicy(store, True, lambda h, k: seen.append(h)).missing_host_key(
        None, "h1", keys[0]
    )
    assert seen == ["h1"] and store.lookup("h1")
    with pytest.raises(hostkeys.UnknownHostKey, match="not pinned"):
        hostkeys.PinningPolicy(store, False).missing_host_key(None, "h2", keys[0])
    assert not store.lookup("h2")


def test_attach_replaces_fabric_autoadd(tmp_path, keys):
    store = hostkeys.PinnedHostKeys(tmp_path / "kh")
    store.record("h1", keys[0])
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.client.AutoAddPolicy())  # what Fabric installs
    store.record("h2", keys[1])
    hostkeys.attach(client, store, ("h1", 22))
    assert isinstance(client._policy, hostkeys.PinningPolicy)
    assert client.get_host_keys().lookup("h1") is not None
    assert client.get_host_keys().lookup("h2") is None  # only the target's keys


def test_file_is_parsed_once_per_change_not_per_lookup(tmp_path, keys, monkeypatch):
    """The quadratic cost of issue 18: every lookup re-read and re-parsed the whole file."""
    store = hostkeys.PinnedHostKeys(tmp_path / "kh")
    for i in range(50):
        store.record(f"10.0.0.{i}", keys[i % 2])
    parses = []
    real = hostkeys.PinnedHostKeys._parse
    monkeypatch.setattr(
        hostkeys.PinnedHostKeys, "_parse", lambda self: parses.append(1) or real(self)
    )
    other = hostkeys.PinnedHostKeys(tmp_path / "kh")  # another store object on the same file
    for _ in range(3):
        for i in range(50):
            assert other.lookup(f"10.0.0.{i}") == {keys[i % 2].get_name(): keys[i % 2]}
    assert len(parses) == 1
    store.record("10.0.0.99", keys[0])  # the file changed: parsed again, once
    assert other.lookup("10.0.0.99") and other.lookup("10.0.0.1") and len(parses) == 2
    assert other.lookup("10.0.0.7", 2222) == {}


def test_hashed_and_wildcard_entries_still_match(tmp_path, keys):
    """Entries the index cannot hold (hashed names, patterns) fall back to paramiko's lookup."""
    path = tmp_path / "kh"
    hashed = paramiko.HostKeys.hash_host("10.9.9.9")
    path.write_text(
        f"{hashed} {keys[0].get_name()} {keys[0].get_base64()}\n"
        f"plain {keys[1].get_name()} {keys[1].get_base64()}\n"
    )
    store = hostkeys.PinnedHostKeys(path)
    assert store.lookup("10.9.9.9") == {keys[0].get_name(): keys[0]}
    assert store.lookup("plain") == {keys[1].get_name(): keys[1]}


def test_threads_asking_at_once_parse_the_file_once(tmp_path, keys, monkeypatch):
    """Every session of a run looks its node up at the same moment: one parse, not one each."""
    import threading
    import time

    store = hostkeys.PinnedHostKeys(tmp_path / "kh")
    for i in range(20):
        store.record(f"10.0.1.{i}", keys[i % 2])
    hostkeys._cache.clear()
    parses = []
    real = hostkeys.PinnedHostKeys._parse

    def slow(self):
        parses.append(1)
        time.sleep(0.2)  # long enough for every thread to be waiting
        return real(self)

    monkeypatch.setattr(hostkeys.PinnedHostKeys, "_parse", slow)
    go = threading.Barrier(16)
    got = []

    def one(i):
        go.wait()
        got.append(hostkeys.PinnedHostKeys(tmp_path / "kh").lookup(f"10.0.1.{i}"))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(parses) == 1
    assert sorted(got, key=str) == sorted(
        ({keys[i % 2].get_name(): keys[i % 2]} for i in range(16)), key=str
    )


def test_the_linear_parse_gives_what_paramiko_load_gives(tmp_path, keys):
    """Comments, blank lines, CRLF, tabs, duplicates (one name pinned twice to one key, one
    line naming a host twice), several names per line, an unknown key type, a short line:
    the entries, names and keys are paramiko's own HostKeys.load's."""
    k0, k1 = (f"{k.get_name()} {k.get_base64()}" for k in keys)
    hashed = paramiko.HostKeys.hash_host("10.9.9.9")
    text = (
        f"# pinned by nodeprep\n\n10.0.0.1 {k0}\r\n10.0.0.1 {k0}\n"
        f"10.0.0.2,10.0.0.2,[10.0.0.3]:2222 {k1}\n"
        f"10.0.0.2\t{k1}\n10.0.0.1 {k1}\n{hashed} {k0}\n*.lab {k1}\nshort line\n"
        f"10.0.0.4 ssh-unknown AAAAB3NzaC1yc2E=\n   10.0.0.5 {k0}   \n"
    )
    path = tmp_path / "kh"
    path.write_bytes(text.encode())
    ref = paramiko.HostKeys()
    ref.load(str(path))
    ours = hostkeys.PinnedHostKeys(path)._parse()

    def pairs(hk):
        return {(h, e.key.get_name(), e.key.get_base64()) for e in hk._entries for h in e.hostnames}

    assert pairs(ours) == pairs(ref)
    assert len([1 for e in ours._entries for h in e.hostnames]) == len(pairs(ours))  # each once
    for name in (
        "10.0.0.1",
        "10.0.0.2",
        "[10.0.0.3]:2222",
        "10.9.9.9",
        "x.lab",
        "10.0.0.5",
        "10.0.0.4",
    ):
        assert dict(ours.lookup(name) or {}) == dict(ref.lookup(name) or {}), name
