"""ssh_config: a managed `Host <node>` block in ~/.ssh/config on every node (reaching the other
nodes with the cluster key) and on the controller (reaching the nodes with the controller key,
checking host keys against the project known_hosts). Content outside the block is kept byte
for byte; the file is 0600 and replaced atomically."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from nodeprep.engine.results import StepResult
from nodeprep.engine.steps import FileBlock, with_block
from nodeprep.engine.facts import FILE

CLUSTER_KEY = "~/.ssh/nodeprep_cluster_ed25519"


def entries(hosts, identity: str | None, extra: list[str] = ()) -> str:
    out = []
    for h in hosts:
        out.append(f"Host {h.name}")
        out.append(f"    HostName {h.address}")
        out.append(f"    Port {h.port}")
        if h.user:
            out.append(f"    User {h.user}")
        if identity:
            out += [f"    IdentityFile {identity}", "    IdentitiesOnly yes"]
        out += [f"    {x}" for x in extra]
    return "\n".join(out) + "\n"


def reads(ctx):
    return [FILE("~/.ssh/config")]


def steps(ctx):
    identity = CLUSTER_KEY if ctx.vars.get("ssh_mesh", True) else None
    return [FileBlock("~/.ssh/config", "hosts", entries(ctx.prov.inventory.hosts, identity), mode=0o600)]


def controller(prov):
    first = prov.vars[prov.hosts[0].name]
    if not first["ssh_config_controller"]:
        return []
    path = Path(first["controller_ssh_config"]).expanduser()
    key = prov.shared.controller_key or Path(first.get("controller_key", "~/.ssh/id_ed25519")).expanduser()
    known = f'UserKnownHostsFile "{prov.settings.known_hosts}"'
    # Lab/inventory keys differ per host in principle; the controller key is on every node.
    body = entries(prov.inventory.hosts, str(key), [known, "StrictHostKeyChecking yes"])
    old = path.read_text() if path.exists() else None
    new = with_block(old, f"hosts {prov.inventory.name}", body)
    name = f"file.block {path} [hosts {prov.inventory.name}]"
    mode_ok = old is None or (path.stat().st_mode & 0o777) == 0o600
    if new == old and mode_ok:
        return [StepResult(name, "ok")]
    if prov.check:
        return [StepResult(name, "changed", "would update")]
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".nodeprep.")
    with os.fdopen(fd, "w") as fh:
        fh.write(new)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return [StepResult(name, "changed", "created" if old is None else "block updated")]
