"""The ssh mesh checked on paper for EVERY ordered pair of nodes, from files the verify probe
reads anyway: node B's ~/.ssh/authorized_keys must hold the cluster key node A logs in with,
and A's ~/.ssh/known_hosts must hold, under the name A dials (the inventory name from the
`hosts` block of A's ~/.ssh/config), the host key the controller pinned for B (the one B's sshd
presented when verify connected to it). Real logins (verify.mesh_start) prove the rest for the
pairs they cover (sshd up, network path, PAM); this covers all N*N pairs for the cost of three
small file reads per node, so big fleets need not pay N*N handshakes."""
from __future__ import annotations

import base64
import fnmatch
import hashlib
import hmac

from .hostkeys import host_entry

CLUSTER_PUB = "~/.ssh/nodeprep_cluster_ed25519.pub"
FILES = ("~/.ssh/authorized_keys", "~/.ssh/known_hosts", CLUSTER_PUB)
_KEY_TYPES = ("ssh-", "ecdsa-", "sk-")


def key_blob(line: str) -> str | None:
    """The base64 key of an authorized_keys / .pub line (options and comment skipped)."""
    fields = line.split()
    for i, f in enumerate(fields[:-1]):
        if f.startswith(_KEY_TYPES) and "=" not in f:
            return fields[i + 1]
    return None


def authorized(text: str | None) -> set[str]:
    out = set()
    for line in (text or "").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            blob = key_blob(line)
            if blob:
                out.add(blob)
    return out


def _name_matches(field: str, name: str) -> bool:
    hit = False
    for pat in field.split(","):
        neg = pat.startswith("!")
        pat = pat[1:] if neg else pat
        if pat.startswith("|1|"):
            try:
                salt, digest = (base64.b64decode(x) for x in pat[3:].split("|", 1))
            except ValueError:
                continue
            ok = hmac.compare_digest(hmac.new(salt, name.encode(), hashlib.sha1).digest(), digest)
        else:
            ok = fnmatch.fnmatchcase(name, pat) if any(c in pat for c in "*?") else pat == name
        if ok and neg:
            return False
        hit = hit or ok
    return hit


def known_keys(text: str | None, name: str) -> tuple[set[str], set[str]]:
    """(key blobs known_hosts accepts for NAME, blobs it marks @revoked)."""
    keys, revoked = set(), set()
    for line in (text or "").splitlines():
        f = line.split()
        if not f or f[0].startswith("#"):
            continue
        marker = None
        if f[0].startswith("@"):
            marker, f = f[0], f[1:]
        if len(f) < 3 or not _name_matches(f[0], name):
            continue
        if marker == "@revoked":
            revoked.add(f[2])
        elif marker is None:
            keys.add(f[2])
    return keys, revoked


def problems(a: str, b, files_a: dict, files_b: dict, pinned_b: set[str]) -> list[str]:
    """Why A -> B would fail, on paper (empty: the files allow it). B: an inventory Host;
    FILES_X: {path: file fact} of node X; PINNED_B: the controller's pinned key blobs of B."""
    out = []
    pub = (files_a.get(CLUSTER_PUB) or {}).get("content")
    offered = key_blob(pub or "")
    if offered is None:
        out.append(f"{a} has no cluster key ({CLUSTER_PUB}): run `invoke provision`")
    elif offered not in authorized((files_b.get("~/.ssh/authorized_keys") or {}).get("content")):
        out.append(f"{b.name}'s ~/.ssh/authorized_keys lacks the cluster key {a} logs in with")
    name = host_entry(b.name, b.port)
    keys, revoked = known_keys((files_a.get("~/.ssh/known_hosts") or {}).get("content"), name)
    if pinned_b & revoked:
        out.append(f"{a}'s ~/.ssh/known_hosts marks {b.name}'s host key @revoked")
    elif not keys:
        out.append(f"{a}'s ~/.ssh/known_hosts has no host key for {name} "
                   "(StrictHostKeyChecking=yes refuses)")
    elif pinned_b and not keys & pinned_b:
        out.append(f"{a}'s ~/.ssh/known_hosts holds another host key for {name} than the one "
                   f"{b.name} presents (stale entry, or the node was reinstalled)")
    return out
