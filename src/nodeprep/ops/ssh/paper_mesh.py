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

from nodeprep.engine.hostkeys import host_entry
from nodeprep.ops.ssh import CLUSTER_KEY

CLUSTER_PUB = CLUSTER_KEY + ".pub"
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


class NodeKnownHosts:
    """A known_hosts text parsed once: plain names in a dict, hashed and pattern entries in a
    list (checked per name: verify asks N*N questions of N files)."""

    def __init__(self, text: str | None):
        self.plain: dict[str, set[str]] = {}
        self.other: list[tuple[str, str]] = []  # (names field, blob)
        self.revoked: list[tuple[str, str]] = []
        for line in (text or "").splitlines():
            f = line.split()
            if not f or f[0].startswith("#"):
                continue
            marker = None
            if f[0].startswith("@"):
                marker, f = f[0], f[1:]
            if len(f) < 3:
                continue
            if marker == "@revoked":
                self.revoked.append((f[0], f[2]))
            elif marker is None:
                if any(c in f[0] for c in "|*?!"):
                    self.other.append((f[0], f[2]))
                else:
                    for name in f[0].split(","):
                        self.plain.setdefault(name, set()).add(f[2])

    def keys(self, name: str) -> tuple[set[str], set[str]]:
        """(key blobs accepted for NAME, blobs marked @revoked for it)."""
        keys = set(self.plain.get(name, ()))
        keys |= {blob for field, blob in self.other if _name_matches(field, name)}
        return keys, {blob for field, blob in self.revoked if _name_matches(field, name)}


def known_keys(text: str | None, name: str) -> tuple[set[str], set[str]]:
    return NodeKnownHosts(text).keys(name)


class NodeFiles:
    """What one node's three files say, parsed once."""

    def __init__(self, files: dict):
        def content(path):
            return (files.get(path) or {}).get("content")

        self.offered = key_blob(content(CLUSTER_PUB) or "")
        self.authorized = authorized(content("~/.ssh/authorized_keys"))
        self.known = NodeKnownHosts(content("~/.ssh/known_hosts"))
        # what decides A -> B on A's side: nodes alike here fail (or pass) the same pairs
        self.state = (self.offered, content("~/.ssh/known_hosts"))


def problems(a: str, b, files_a, files_b, pinned_b: set[str]) -> list[str]:
    """Why A -> B would fail, on paper (empty: the files allow it). B: an inventory Host;
    FILES_X: NodeFiles (or the {path: file fact} dict) of node X; PINNED_B: the controller's
    pinned key blobs of B."""
    fa = files_a if isinstance(files_a, NodeFiles) else NodeFiles(files_a)
    fb = files_b if isinstance(files_b, NodeFiles) else NodeFiles(files_b)
    out = []
    if fa.offered is None:
        out.append(f"{a} has no cluster key ({CLUSTER_PUB}): run `invoke provision`")
    elif fa.offered not in fb.authorized:
        out.append(f"{b.name}'s ~/.ssh/authorized_keys lacks the cluster key {a} logs in with")
    name = host_entry(b.name, b.port)
    keys, revoked = fa.known.keys(name)
    if pinned_b & revoked:
        out.append(f"{a}'s ~/.ssh/known_hosts marks {b.name}'s host key @revoked")
    elif not keys:
        out.append(
            f"{a}'s ~/.ssh/known_hosts has no host key for {name} "
            "(StrictHostKeyChecking=yes refuses)"
        )
    elif pinned_b and not keys & pinned_b:
        out.append(
            f"{a}'s ~/.ssh/known_hosts holds another host key for {name} than the one "
            f"{b.name} presents (stale entry, or the node was reinstalled)"
        )
    return out


_A = "\x00A\x00"  # stands for the node A in a shared answer; never in a host name


class PaperMesh:
    """Every pair A -> B on paper, for the cost of one pass over the fleet per distinct state
    of A's files (on a converged fleet: one), not N*N problems() calls: A's side of a pair
    depends only on its cluster key and its known_hosts (NodeFiles.state). HOSTS: the
    inventory's; PAPER: {node: NodeFiles} of the nodes that manage the mesh; PINNED: {node:
    the controller's pinned key blobs}."""

    def __init__(self, hosts, paper: dict, pinned: dict):
        self.paper, self.pinned = paper, pinned
        self.targets = [b for b in hosts if b.name in paper]
        self.order = {h.name: i for i, h in enumerate(hosts)}
        self._by_state: dict = {}

    def failing(self, a: str) -> dict[str, list[str]]:
        """{B: why A -> B fails} for the pairs that fail, in inventory order."""
        fa = self.paper.get(a)
        if fa is None:
            return {}
        if fa.state not in self._by_state:
            self._by_state[fa.state] = {
                b.name: why
                for b in self.targets
                if (why := problems(_A, b, fa, self.paper[b.name], self.pinned.get(b.name, set())))
            }
        return {b: [w.replace(_A, a) for w in why] for b, why in self._by_state[fa.state].items()}
