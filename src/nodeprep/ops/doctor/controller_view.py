"""What `invoke doctor` looks at on the controller (`look`): the keys and their modes, the
ssh-agent, the controller's ssh config with its managed blocks and the aliases the selected
inventory's block would write, the Python and the tool's dependencies, as a plain `View`;
controller.py's checks are pure functions of it."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path

from nodeprep.ops.ssh import config_blocks

DEFAULT_KEYS = ("id_ed25519", "id_ecdsa", "id_rsa", "id_ed25519_sk", "id_ecdsa_sk")


@dataclass
class KeyFile:
    path: str
    named: str  # "key: of FILE:LINE" (the inventory's), or "default"
    exists: bool = True
    _: KW_ONLY
    mode: int | None = None
    encrypted: bool | None = None  # None: not a key paramiko reads


@dataclass
class Alias:
    """One Host alias the selected inventory's block would write, and where it is already
    defined otherwise (config_blocks.Defined)."""

    alias: str
    address: str
    port: int
    clashes: list = field(default_factory=list)


@dataclass
class View:
    ssh_dir: str
    ssh_dir_mode: int | None
    keys: list[KeyFile]
    _: KW_ONLY
    agent_sock: str | None
    agent_rc: int | None  # ssh-add -l: 0 keys listed, 1 none, 2 no agent answers
    agent_keys: int
    config_path: str
    config_mode: int | None  # None: no such file
    config_error: str = ""
    blocks: list[tuple[str, int, bool]] = field(default_factory=list)  # (inventory, line, alive)
    aliases: list[Alias] = field(default_factory=list)
    inventory: str | None = None  # the selected inventory's block name
    label: str = "inv"  # a short name for it (a prefix suggestion)
    prefix: str = ""  # its ssh_alias_prefix now
    python: tuple = tuple(sys.version_info[:3])
    deps: list[tuple[str, str, str | None]] = field(
        default_factory=list
    )  # (name, pinned, installed)
    labs: list[tuple[str, str, str]] = field(default_factory=list)  # (lab, problem, fix)
    hosts: int = 0  # the selected inventory's nodes
    inventory_error: tuple[str, str] | None = (
        None  # (FILE:LINE: what is wrong, the fix) when it did not load
    )


def _mode(path: Path) -> int | None:
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return None


def _encrypted(path: Path) -> bool | None:
    import paramiko

    for kind in (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey):
        try:
            kind.from_private_key_file(str(path))
            return False
        except paramiko.PasswordRequiredException:
            return True
        except (paramiko.SSHException, OSError, ValueError):
            continue
    return None


def keys_of(hosts) -> list[KeyFile]:
    """The inventory's key files (each once) and, where a host names none, the default keys
    that exist (what ssh and nodeprep offer then)."""
    out, seen = [], set()
    for h in hosts:
        if h.key and h.key not in seen:
            seen.add(h.key)
            out.append(
                KeyFile(str(Path(h.key).expanduser()), f"key: of {h.origin.get('key') or h.name}")
            )
    if not hosts or any(not h.key for h in hosts):
        out += [
            KeyFile(str(p), "default")
            for p in (Path("~/.ssh").expanduser() / n for n in DEFAULT_KEYS)
            if p.is_file()
        ]
    for k in out:
        p = Path(k.path)
        k.exists, k.mode = p.is_file(), _mode(p)
        k.encrypted = _encrypted(p) if k.exists else None
    return out


def _agent() -> tuple[str | None, int | None, int]:
    sock = os.environ.get("SSH_AUTH_SOCK") or None
    if not sock:
        return None, None, 0
    try:
        r = subprocess.run(["ssh-add", "-l"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return sock, 2, 0
    return sock, r.returncode, len(r.stdout.splitlines()) if r.returncode == 0 else 0


def _deps(requirements: Path) -> list[tuple[str, str, str | None]]:
    from importlib import metadata

    out = []
    for line in requirements.read_text().splitlines() if requirements.is_file() else []:
        line = line.split("#", 1)[0].strip()
        if "==" not in line:
            continue
        name, pinned = (x.strip() for x in line.split("==", 1))
        try:
            out.append((name, pinned, metadata.version(name)))
        except metadata.PackageNotFoundError:
            out.append((name, pinned, None))
    return out


def look(project: Path, config: Path, inv=None, hosts=(), prefix: str = "") -> View:
    """The controller as it is now. CONFIG: the ssh config provision writes (the inventory's
    controller_ssh_config); INV, HOSTS, PREFIX: the selected inventory, its nodes and its
    ssh_alias_prefix (the aliases its block would write)."""
    ssh_dir = Path("~/.ssh").expanduser()
    sock, rc, n = _agent()
    v = View(
        str(ssh_dir),
        _mode(ssh_dir),
        keys_of(list(hosts)),
        agent_sock=sock,
        agent_rc=rc,
        agent_keys=n,
        config_path=str(config),
        config_mode=_mode(config),
        deps=_deps(project / "requirements" / "tool.txt"),
    )
    try:
        text = config.read_text(encoding="utf-8", errors="replace") if config.is_file() else ""
    except OSError as e:
        v.config_error, text = e.strerror or str(e), ""
    v.blocks = [
        (name, line, config_blocks.block_alive(name, project))
        for name, line in config_blocks.blocks(text)
    ]
    if inv is not None:
        v.inventory, v.prefix = config_blocks.block_name(inv, project), prefix
        p = Path(inv.path) if inv.path else None
        v.label = (
            inv.name
            if p is None or "/" not in inv.name
            else (p.parent.name if p.is_file() else p.name)
        )
        wanted = {prefix + h.name: h for h in hosts}
        found = config_blocks.defined(text, str(config), v.inventory, set(wanted)) if text else {}
        v.aliases = [
            Alias(
                a,
                h.address,
                int(h.port),
                [
                    d
                    for d in found.get(a, [])
                    if d.hostname not in (None, h.address) or d.port not in (None, int(h.port))
                ],
            )
            for a, h in wanted.items()
        ]
    return v
