"""The on-paper ssh mesh check: authorized_keys and known_hosts as OpenSSH writes them (key
options, comments, hashed names, [name]:port, patterns, @revoked)."""

from __future__ import annotations

import base64
import hashlib
import hmac
from types import SimpleNamespace

from nodeprep.ops.ssh import paper_mesh as M

CLUSTER = "AAAAC3NzaC1lZDI1NTE5AAAAIClusterKeyBlob"
HOSTB = "AAAAC3NzaC1lZDI1NTE5AAAAIHostKeyOfB"
OTHER = "AAAAC3NzaC1lZDI1NTE5AAAAIOtherKey"


def hashed(name: str, salt: bytes = b"0123456789abcdefghij") -> str:
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


def test_authorized_keys_lines_with_options_and_comments():
    text = (
        f"# comment\n\nssh-ed25519 {OTHER} me@laptop\n"
        f'from="10.0.0.0/8",no-pty,command="/bin/true x=1" ssh-ed25519 {CLUSTER} nodeprep cluster\n'
        f"sk-ssh-ed25519@openssh.com AAAASk yubikey\n"
    )
    assert M.authorized(text) == {OTHER, CLUSTER, "AAAASk"}
    assert M.authorized(None) == set()


def test_known_hosts_names_plain_hashed_port_pattern_revoked():
    text = (
        f"worker-1,10.0.0.11 ssh-ed25519 {HOSTB}\n"
        f"{hashed('worker-2')} ssh-ed25519 {OTHER}\n"
        f"[worker-3]:2222 ssh-ed25519 {HOSTB}\n"
        f"gpu* ssh-ed25519 {OTHER}\n"
        f"*.lab,!bad.lab ssh-ed25519 {CLUSTER}\n"
        f"@revoked worker-4 ssh-ed25519 {HOSTB}\n"
    )
    assert M.known_keys(text, "worker-1") == ({HOSTB}, set())
    assert M.known_keys(text, "worker-2") == ({OTHER}, set())
    assert M.known_keys(text, "worker-3") == (set(), set())  # only as [worker-3]:2222
    assert M.known_keys(text, "[worker-3]:2222") == ({HOSTB}, set())
    assert M.known_keys(text, "gpu07") == ({OTHER}, set())
    assert M.known_keys(text, "bad.lab") == (set(), set())
    assert M.known_keys(text, "worker-4") == (set(), {HOSTB})


def files(pub=CLUSTER, ak=(), kh=""):
    return {
        M.CLUSTER_PUB: {"content": f"ssh-ed25519 {pub} nodeprep cluster\n" if pub else None},
        "~/.ssh/authorized_keys": {"content": "".join(f"ssh-ed25519 {k}\n" for k in ak)},
        "~/.ssh/known_hosts": {"content": kh},
    }


def test_problems_per_pair():
    b = SimpleNamespace(name="worker-1", port=22)
    a_ok = files(kh=f"worker-1 ssh-ed25519 {HOSTB}\n")
    b_ok = files(ak=[CLUSTER])
    assert M.problems("worker-0", b, a_ok, b_ok, {HOSTB}) == []
    assert M.problems("worker-0", b, a_ok, files(ak=[OTHER]), {HOSTB}) == [
        "worker-1's ~/.ssh/authorized_keys lacks the cluster key worker-0 logs in with"
    ]
    assert (
        "has no cluster key"
        in M.problems(
            "worker-0", b, files(pub=None, kh=a_ok["~/.ssh/known_hosts"]["content"]), b_ok, {HOSTB}
        )[0]
    )
    assert M.problems("worker-0", b, files(), b_ok, {HOSTB}) == [
        "worker-0's ~/.ssh/known_hosts has no host key for worker-1 "
        "(StrictHostKeyChecking=yes refuses)"
    ]
    stale = M.problems("worker-0", b, files(kh=f"worker-1 ssh-ed25519 {OTHER}\n"), b_ok, {HOSTB})
    assert stale and "another host key for worker-1" in stale[0]
    revoked = M.problems(
        "worker-0",
        b,
        files(kh=f"worker-1 ssh-ed25519 {HOSTB}\n@revoked * ssh-ed25519 {HOSTB}\n"),
        b_ok,
        {HOSTB},
    )
    assert revoked == ["worker-0's ~/.ssh/known_hosts marks worker-1's host key @revoked"]
    b2222 = SimpleNamespace(name="worker-1", port=2222)
    assert (
        M.problems(
            "worker-0", b2222, files(kh=f"[worker-1]:2222 ssh-ed25519 {HOSTB}\n"), b_ok, {HOSTB}
        )
        == []
    )


def test_paper_mesh_is_every_pair_at_the_cost_of_one_pass_per_state(monkeypatch):
    """PaperMesh gives what problems() gives pair by pair, on a fleet where nodes differ
    (one lacks the cluster key, one has a stale entry, one is not authorized, node names
    that contain each other), while calling problems() once per target per distinct state."""
    from nodeprep.ops.verify import checks

    n = 12
    hosts = [SimpleNamespace(name=f"worker-{i}", port=22) for i in range(n)]
    keys = {h.name: f"{HOSTB}{i}" for i, h in enumerate(hosts)}
    good_kh = "".join(f"{h.name} ssh-ed25519 {keys[h.name]}\n" for h in hosts)
    raw = {h.name: files(ak=[CLUSTER], kh=good_kh) for h in hosts}
    raw["worker-1"] = files(pub=None, ak=[CLUSTER], kh=good_kh)  # no cluster key
    raw["worker-10"] = files(ak=[CLUSTER], kh=good_kh.replace(keys["worker-3"], OTHER))  # stale
    raw["worker-11"] = files(ak=[OTHER], kh=good_kh)  # not authorized
    paper = {name: M.NodeFiles(f) for name, f in raw.items()}
    pinned = {name: {k} for name, k in keys.items()}
    expect = {
        a.name: {
            b.name: M.problems(a.name, b, paper[a.name], paper[b.name], pinned[b.name])
            for b in hosts
        }
        for a in hosts
    }
    calls = []
    real = M.problems
    monkeypatch.setattr(M, "problems", lambda *a: calls.append(a) or real(*a))
    mesh = M.PaperMesh(hosts, paper, pinned)
    for a in hosts:
        assert mesh.failing(a.name) == {b: w for b, w in expect[a.name].items() if w}
    assert len(calls) == 3 * n  # three distinct states: the rest, worker-1, worker-10
    v_of = {h.name: {"ssh_mesh": True} for h in hosts}
    found = checks.mesh_checks(
        hosts[10], {"worker-3": (0, ""), "worker-5": (255, "refused")}, v_of, mesh
    )
    # a real login that worked beats the paper; one that failed is reported; inventory order
    assert [f["message"] for f in found] == [
        "worker-10 -> worker-5: login failed (exit 255): refused",
        "worker-10 -> worker-11: " + "; ".join(expect["worker-10"]["worker-11"]),
    ]
    # nodes alike share one answer, each under its own name
    assert mesh.failing("worker-2") == {
        "worker-11": [
            "worker-11's ~/.ssh/authorized_keys lacks the cluster key worker-2 logs in with"
        ]
    }
    found = checks.mesh_checks(hosts[1], {}, v_of, mesh)
    assert found and all(
        f["message"].startswith("worker-1 -> ") and "worker-1 has no cluster key" in f["message"]
        for f in found
    )
