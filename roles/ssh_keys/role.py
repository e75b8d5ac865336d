"""ssh_keys: the controller's key (and the inventory key this run logs in with) authorized on
every node; with ssh_mesh, a dedicated cluster key on every node plus every node's pinned host
key in every node's known_hosts, under each name it is reached by, so node-to-node ssh never
prompts and never needs checking turned off.

The cluster key is made on the controller once (`.nodeprep/cluster_key/`) and is the only
private key that ever leaves it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from nodeprep.engine.facts import FILE
from nodeprep.engine.hostkeys import PinnedHostKeys, host_entry
from nodeprep.engine.results import StepResult
from nodeprep.engine.steps import FileBlock, FileContent
from nodeprep.errors import NodeprepError
from nodeprep.ops.ssh import CLUSTER_KEY


def _keygen(path: Path, comment: str, check: bool) -> StepResult:
    name = f"ssh.keygen {path}"
    if path.exists() and path.with_name(path.name + ".pub").exists():
        if path.stat().st_mode & 0o077:
            if check:
                return StepResult(name, "changed", "would chmod 600")
            os.chmod(path, 0o600)
            return StepResult(name, "changed", "mode set to 600")
        return StepResult(name, "ok")
    if check:
        return StepResult(name, "changed", "would create an ed25519 key")
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    r = subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        capture_output=True,
        text=True,
    )
    if r.returncode:
        raise NodeprepError(f"ssh-keygen {path} failed: {r.stderr.strip()}")
    return StepResult(name, "changed", "created")


def _pub(path: Path) -> str | None:
    pub = path.with_name(path.name + ".pub")
    return pub.read_text().strip() if pub.exists() else None


def _once(prov, path: Path | None, read):
    """READ(path), once per run (steps() runs per node: N reads of the same key file)."""
    if path is None:
        return None
    texts = prov.shared.key_texts
    if (path, read) not in texts:
        texts[(path, read)] = read(path)
    return texts[(path, read)]


def validate(prov):
    prov.shared.controller_key = Path(next(iter(prov.vars.values()))["controller_key"]).expanduser()
    prov.shared.cluster_key = prov.settings.state / "cluster_key" / "id_ed25519"


def controller(prov):
    results = [_keygen(prov.shared.controller_key, "nodeprep controller", prov.check_mode)]
    if any(v["ssh_mesh"] for v in prov.vars.values()):
        results.append(_keygen(prov.shared.cluster_key, "nodeprep cluster", prov.check_mode))
    return results


def reads(ctx):
    files = [FILE("~/.ssh/authorized_keys")]
    if ctx.vars["ssh_mesh"]:
        files += [FILE(CLUSTER_KEY), FILE(CLUSTER_KEY + ".pub"), FILE("~/.ssh/known_hosts")]
    return files


def known_hosts_lines(prov) -> list[str]:
    """Every node's pinned keys under each name it is reached by: the same block for every
    node, so it is built once per run (it was built per node: N x N lookups)."""
    if prov.shared.known_hosts is not None:
        return prov.shared.known_hosts
    store = PinnedHostKeys(prov.settings.known_hosts)
    lines = []  # published when complete: steps() of other nodes may run in other threads
    for h in prov.inventory.hosts:
        keys = store.lookup(h.address, h.port)
        names = {host_entry(h.name, h.port), host_entry(h.address, h.port)}
        for ktype, key in sorted(keys.items()):
            lines.append(f"{','.join(sorted(names))} {ktype} {key.get_base64()}")
    prov.shared.known_hosts = lines
    return lines


def steps(ctx):
    prov, mesh = ctx.prov, ctx.vars["ssh_mesh"]
    # In --check mode the keys may not exist yet: plan with what there is.
    # The key this prov connects with stays authorized: rewriting the block must never lock
    # nodeprep out (e.g. after --ask-pass installed access, or when controller_key changes).
    login = _once(prov, Path(ctx.host.key).expanduser(), _pub) if ctx.host.key else None
    keys = list(
        dict.fromkeys(
            k
            for k in (
                _once(prov, prov.shared.controller_key, _pub),
                login,
                _once(prov, prov.shared.cluster_key, _pub) if mesh else None,
            )
            if k
        )
    )
    out = [FileBlock("~/.ssh/authorized_keys", "ssh_keys", "\n".join(keys) + "\n", mode=0o600)]
    if mesh and prov.shared.cluster_key.exists():
        private = _once(prov, prov.shared.cluster_key, Path.read_text)
        out += [
            FileContent(CLUSTER_KEY, private, 0o600, secrets=[private]),
            FileContent(
                CLUSTER_KEY + ".pub", _once(prov, prov.shared.cluster_key, _pub) + "\n", 0o644
            ),
            FileBlock(
                "~/.ssh/known_hosts", "cluster hosts", "\n".join(known_hosts_lines(prov)) + "\n"
            ),
        ]
    return out
