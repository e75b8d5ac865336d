"""The on-paper ssh mesh check: authorized_keys and known_hosts as OpenSSH writes them (key
options, comments, hashed names, [name]:port, patterns, @revoked)."""
from __future__ import annotations

import base64
import hashlib
import hmac
from types import SimpleNamespace

from nodeprep.ops import meshcheck as M

CLUSTER = "AAAAC3NzaC1lZDI1NTE5AAAAIClusterKeyBlob"
HOSTB = "AAAAC3NzaC1lZDI1NTE5AAAAIHostKeyOfB"
OTHER = "AAAAC3NzaC1lZDI1NTE5AAAAIOtherKey"


def hashed(name: str, salt: bytes = b"0123456789abcdefghij") -> str:
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


def test_authorized_keys_lines_with_options_and_comments():
    text = (f"# comment\n\nssh-ed25519 {OTHER} me@laptop\n"
            f'from="10.0.0.0/8",no-pty,command="/bin/true x=1" ssh-ed25519 {CLUSTER} nodeprep cluster\n'
            f"sk-ssh-ed25519@openssh.com AAAASk yubikey\n")
    assert M.authorized(text) == {OTHER, CLUSTER, "AAAASk"}
    assert M.authorized(None) == set()


def test_known_hosts_names_plain_hashed_port_pattern_revoked():
    text = (f"worker-1,10.0.0.11 ssh-ed25519 {HOSTB}\n"
            f"{hashed('worker-2')} ssh-ed25519 {OTHER}\n"
            f"[worker-3]:2222 ssh-ed25519 {HOSTB}\n"
            f"gpu* ssh-ed25519 {OTHER}\n"
            f"*.lab,!bad.lab ssh-ed25519 {CLUSTER}\n"
            f"@revoked worker-4 ssh-ed25519 {HOSTB}\n")
    assert M.known_keys(text, "worker-1") == ({HOSTB}, set())
    assert M.known_keys(text, "worker-2") == ({OTHER}, set())
    assert M.known_keys(text, "worker-3") == (set(), set())       # only as [worker-3]:2222
    assert M.known_keys(text, "[worker-3]:2222") == ({HOSTB}, set())
    assert M.known_keys(text, "gpu07") == ({OTHER}, set())
    assert M.known_keys(text, "bad.lab") == (set(), set())
    assert M.known_keys(text, "worker-4") == (set(), {HOSTB})


def files(pub=CLUSTER, ak=(), kh=""):
    return {M.CLUSTER_PUB: {"content": f"ssh-ed25519 {pub} nodeprep cluster\n" if pub else None},
            "~/.ssh/authorized_keys": {"content": "".join(f"ssh-ed25519 {k}\n" for k in ak)},
            "~/.ssh/known_hosts": {"content": kh}}


def test_problems_per_pair():
    b = SimpleNamespace(name="worker-1", port=22)
    a_ok = files(kh=f"worker-1 ssh-ed25519 {HOSTB}\n")
    b_ok = files(ak=[CLUSTER])
    assert M.problems("worker-0", b, a_ok, b_ok, {HOSTB}) == []
    assert M.problems("worker-0", b, a_ok, files(ak=[OTHER]), {HOSTB}) == [
        "worker-1's ~/.ssh/authorized_keys lacks the cluster key worker-0 logs in with"]
    assert "has no cluster key" in M.problems("worker-0", b, files(pub=None, kh=a_ok["~/.ssh/known_hosts"]["content"]),
                                              b_ok, {HOSTB})[0]
    assert M.problems("worker-0", b, files(), b_ok, {HOSTB}) == [
        "worker-0's ~/.ssh/known_hosts has no host key for worker-1 (StrictHostKeyChecking=yes refuses)"]
    stale = M.problems("worker-0", b, files(kh=f"worker-1 ssh-ed25519 {OTHER}\n"), b_ok, {HOSTB})
    assert stale and "another host key for worker-1" in stale[0]
    revoked = M.problems("worker-0", b, files(kh=f"worker-1 ssh-ed25519 {HOSTB}\n@revoked * ssh-ed25519 {HOSTB}\n"),
                         b_ok, {HOSTB})
    assert revoked == ["worker-0's ~/.ssh/known_hosts marks worker-1's host key @revoked"]
    b2222 = SimpleNamespace(name="worker-1", port=2222)
    assert M.problems("worker-0", b2222, files(kh=f"[worker-1]:2222 ssh-ed25519 {HOSTB}\n"), b_ok, {HOSTB}) == []
