"""The project known_hosts store: record on first contact, refuse a change, pin/forget."""
import subprocess

import paramiko
import pytest

from nodeprep.engine import hostkeys


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    for i in range(2):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / f"k{i}")],
                       check=True)
    return [paramiko.Ed25519Key.from_private_key_file(str(d / f"k{i}")) for i in range(2)]


def test_host_entry_format():
    assert hostkeys.host_entry("10.0.0.1", 22) == "10.0.0.1"
    assert hostkeys.host_entry("10.0.0.1", 2222) == "[10.0.0.1]:2222"


def test_record_then_changed_key_refused(tmp_path, keys):
    store = hostkeys.KnownHosts(tmp_path / "kh")
    assert store.record("[10.0.0.1]:2222", keys[0]) is True
    assert store.record("[10.0.0.1]:2222", keys[0]) is False
    with pytest.raises(hostkeys.HostKeyChanged):
        store.record("[10.0.0.1]:2222", keys[1])
    assert store.lookup("10.0.0.1", 2222) == {"ssh-ed25519": keys[0]}
    assert (tmp_path / "kh").stat().st_mode & 0o777 == 0o600


def test_pin_replaces_and_forget_removes(tmp_path, keys):
    store = hostkeys.KnownHosts(tmp_path / "kh")
    store.record("a", keys[0])
    store.record("b", keys[0])
    assert store.pin("a", keys[1]) is True
    assert store.pin("a", keys[1]) is False
    assert store.lookup("a") == {"ssh-ed25519": keys[1]}
    assert store.lookup("b") == {"ssh-ed25519": keys[0]}
    assert store.forget("a") == 1
    assert store.lookup("a") == {}


def test_policy_records_or_refuses(tmp_path, keys):
    store = hostkeys.KnownHosts(tmp_path / "kh")
    seen = []
    hostkeys.PinningPolicy(store, True, lambda h, k: seen.append(h)).missing_host_key(None, "h1", keys[0])
    assert seen == ["h1"] and store.lookup("h1")
    with pytest.raises(hostkeys.UnknownHostKey, match="not pinned"):
        hostkeys.PinningPolicy(store, False).missing_host_key(None, "h2", keys[0])
    assert not store.lookup("h2")


def test_attach_replaces_fabric_autoadd(tmp_path, keys):
    store = hostkeys.KnownHosts(tmp_path / "kh")
    store.record("h1", keys[0])
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.client.AutoAddPolicy())  # what Fabric installs
    hostkeys.attach(client, store)
    assert isinstance(client._policy, hostkeys.PinningPolicy)
    assert client.get_host_keys().lookup("h1") is not None
