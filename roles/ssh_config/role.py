"""ssh_config: a managed `Host <node>` block in ~/.ssh/config on every node (reaching the other
nodes with the cluster key) and on the controller (reaching the nodes with the controller key,
checking host keys against the project known_hosts). Content outside the block is kept byte
for byte; the file is 0600 and replaced atomically.

On the controller each inventory has a block of its own (`hosts <inventory>`); an alias that
another inventory's block or the user's own entries define with another address is refused
before anything changes, naming both places (ops/ssh/config_blocks), unless the inventory sets
`ssh_alias_prefix`. Every value is written as one ssh_config word (config_blocks.word)."""

from __future__ import annotations

import getpass
import os
import re
import tempfile
from pathlib import Path

from nodeprep.engine.facts import FILE
from nodeprep.engine.results import StepResult
from nodeprep.engine.steps import FileBlock, with_block
from nodeprep.errors import InputError
from nodeprep.ops.ssh import CLUSTER_KEY, config_blocks


def entries(
    hosts, identity: str | None, extra: list[str] = (), prefix: str = "", controller: bool = False
) -> str:
    """The block's Host entries. The block goes FIRST in the file (ssh takes the first value it
    finds: a user's `Host *` above it would override them) and ends with `Match all`, so the
    user's own lines after it apply as they did before. On the controller the entries say what
    nodeprep itself connects with: the inventory's user (else this user) and key, then the
    controller key, and the node's jump hosts (ProxyJump, each hop with its user, and an entry
    per hop with the same keys and known_hosts), so `ssh NODE` goes where nodeprep went."""
    out = []
    word = config_blocks.word
    hops: dict = {}
    for h in hosts:
        out.append(f"Host {prefix}{h.name}")
        out.append(f"    HostName {word(h.address)}")
        out.append(f"    Port {int(h.port)}")
        user = h.user or (getpass.getuser() if controller else None)
        if user:
            out.append(f"    User {word(user)}")
        keys = ([str(Path(h.key).expanduser())] if controller and h.key else []) + (
            [identity] if identity else []
        )
        out += [f"    IdentityFile {word(k)}" for k in dict.fromkeys(keys)]
        if keys:
            out.append("    IdentitiesOnly yes")
        if controller and getattr(h, "jump", ()):
            chain = [_hop(hop, user) for hop in h.jump]
            out.append(f"    ProxyJump {word(','.join(chain))}")
            for hop in h.jump:
                hops.setdefault(hop.address, keys)
        out += [f"    {x}" for x in extra]
    for address, keys in hops.items():  # the hops' own entries: the same keys and pins
        out.append(f"Host {address}")
        out += [f"    IdentityFile {word(k)}" for k in dict.fromkeys(keys)]
        out += ["    IdentitiesOnly yes"] if keys else []
        out += [f"    {x}" for x in extra]
    return "\n".join(out + ["Match all"]) + "\n"


def _hop(hop, user: str | None) -> str:
    """A ProxyJump destination: the hop's user (else the node's), its address, its port."""
    who = hop.user or user
    addr = f"[{hop.address}]" if ":" in hop.address else hop.address
    return f"{who + '@' if who else ''}{addr}" + (f":{hop.port}" if hop.port != 22 else "")


def validate(prov):
    first = prov.hosts[0].name
    prefix = str(prov.vars[first]["ssh_alias_prefix"] or "")
    if prefix and not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", prefix):
        raise InputError(
            f"ssh_alias_prefix: {prefix[:40]!r} is not the start of a host name",
            "use letters, digits, '.', '_' and '-', e.g. lab-",
            *prov.origin(first, "ssh_alias_prefix"),
        )
    for var in ("controller_key", "controller_ssh_config", "key"):
        for node, v in prov.vars.items():
            if v.get(var) and ('"' in str(v[var])):
                raise InputError(
                    f"{var}: a path with '\"' cannot be written into an ssh config",
                    "rename the file",
                    *prov.origin(node, var),
                )
    if prov.vars[first]["ssh_config_controller"]:
        path = _controller_file(prov)
        if not str(prov.vars[first]["controller_ssh_config"]).strip() or path.is_dir():
            raise InputError(
                f"controller_ssh_config: {str(path)[:80]!r} is not a file path",
                "e.g. ~/.ssh/config",
                *prov.origin(first, "controller_ssh_config"),
            )
        _refuse_conflicts(prov)


def _block_name(prov) -> str:
    """The inventory's block on the controller: its name for inventory/NAME, else its path."""
    return config_blocks.block_name(prov.inventory, Path(prov.settings.project))


def _controller_file(prov) -> Path:
    return Path(prov.vars[prov.hosts[0].name]["controller_ssh_config"]).expanduser()


def _refuse_conflicts(prov) -> None:
    path = _controller_file(prov)
    try:
        text = path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}", "check its permissions") from None
    prefix = str(prov.vars[prov.hosts[0].name]["ssh_alias_prefix"] or "")
    inv = prov.inventory
    wanted = [
        (
            prefix + h.name,
            h.address,
            int(h.port),
            h.origin.get("address") or str(inv.path or inv.name),
        )
        for h in inv.hosts
    ]
    found = config_blocks.conflicts(wanted, text, str(path), _block_name(prov))
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise InputError(
            found[0] + more,
            "two inventories name their nodes alike: set "
            "ssh_alias_prefix in this one (e.g. ssh_alias_prefix: lab-), or remove "
            "the other entry",
        )


def reads(ctx):
    return [FILE("~/.ssh/config")]


def steps(ctx):
    """Every node's block lists the whole fleet: built once per run per identity (building it
    per node made N x N entries on the controller)."""
    identity = CLUSTER_KEY if ctx.vars.get("ssh_mesh", True) else None
    built = ctx.prov.shared.ssh_entries
    if identity not in built:
        built[identity] = entries(ctx.prov.inventory.hosts, identity)
    return [FileBlock("~/.ssh/config", "hosts", built[identity], mode=0o600, where="first")]


def controller(prov):
    first = prov.vars[prov.hosts[0].name]
    if not first["ssh_config_controller"]:
        return []
    path = _controller_file(prov)
    key = (
        prov.shared.controller_key
        or Path(first.get("controller_key", "~/.ssh/id_ed25519")).expanduser()
    )
    known = f"UserKnownHostsFile {config_blocks.word(str(prov.settings.known_hosts))}"
    # Lab/inventory keys differ per host in principle; the controller key is on every node.
    _refuse_conflicts(prov)  # again: the file may have changed since validate
    prefix = str(first["ssh_alias_prefix"] or "")
    body = entries(
        prov.inventory.hosts,
        str(key),
        [known, "StrictHostKeyChecking yes"],
        prefix,
        controller=True,
    )
    old = path.read_text() if path.exists() else None
    block = f"hosts {_block_name(prov)}"
    new = with_block(old, block, body, "first")
    name = f"file.block {path} [{block}]"
    mode_ok = old is None or (path.stat().st_mode & 0o777) == 0o600
    if new == old and mode_ok:
        return [StepResult(name, "ok")]
    if prov.check_mode:
        return [StepResult(name, "changed", "would update")]
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".nodeprep.")
    with os.fdopen(fd, "w") as fh:
        fh.write(new)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return [StepResult(name, "changed", "created" if old is None else "block updated")]
