"""The controller's side of `invoke doctor`: what is looked at (`look`: the keys and their
modes, the ssh-agent, the controller's ssh config with its managed blocks, the Python and the
tool's dependencies) as a plain `View`, and the checks, pure functions of a View that return
(code, verdict, reason, fix) tuples with the exact command that fixes each finding."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path

from nodeprep.ops.health.findings import Verdict
from nodeprep.ops.ssh import config_blocks

DEFAULT_KEYS = ("id_ed25519", "id_ecdsa", "id_rsa", "id_ed25519_sk", "id_ecdsa_sk")
MIN_PYTHON = (3, 10)  # the controller's own floor (requirements/tool.txt's pins need it)


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


# -- looking --------------------------------------------------------------------------------


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


# -- checks ---------------------------------------------------------------------------------


def _loose(mode: int | None, mask: int) -> bool:
    return mode is not None and bool(mode & mask)


def ssh_keys(v: View) -> list:
    out = []
    if _loose(v.ssh_dir_mode, 0o022):
        out.append(
            (
                "SSH_DIR_MODE",
                Verdict.CRITICAL,
                f"{v.ssh_dir} is writable by others (mode "
                f"{v.ssh_dir_mode:04o}): OpenSSH and sshd refuse keys and configs there",
                f"chmod 700 {v.ssh_dir}",
            )
        )
    for k in v.keys:
        if not k.exists:
            out.append(
                (
                    "KEY_MISSING",
                    Verdict.CRITICAL,
                    f"{k.path} ({k.named}) does not exist",
                    f"ssh-keygen -t ed25519 -N '' -f {k.path}  "
                    f"(then ssh-copy-id -i {k.path}.pub to each node)",
                )
            )
        elif _loose(k.mode, 0o077):
            out.append(
                (
                    "KEY_MODE",
                    Verdict.CRITICAL,
                    f"{k.path} is readable by others (mode {k.mode:04o}): "
                    "OpenSSH refuses it (UNPROTECTED PRIVATE KEY FILE)",
                    f"chmod 600 {k.path}",
                )
            )
        elif k.encrypted and (v.agent_rc != 0 or not v.agent_keys):
            out.append(
                (
                    "KEY_LOCKED",
                    Verdict.WARN,
                    f"{k.path} has a passphrase and no ssh-agent holds a "
                    "key: nodeprep cannot use it",
                    f'eval "$(ssh-agent -s)" && ssh-add {k.path}',
                )
            )
    if not v.keys and not v.agent_keys:
        out.append(
            (
                "NO_KEY",
                Verdict.CRITICAL,
                "no key: none in the inventory, no ~/.ssh/id_*, no agent key",
                "ssh-keygen -t ed25519 -N '' -f ~/.ssh/id_ed25519  (then ssh-copy-id to each node)",
            )
        )
    return out or [
        (
            "KEYS_OK",
            Verdict.OK,
            f"{len(v.keys)} key file(s), private modes"
            + (f"; the agent holds {v.agent_keys}" if v.agent_keys else ""),
            "",
        )
    ]


def ssh_agent(v: View) -> list:
    if v.agent_sock is None:
        return [
            (
                "AGENT_NONE",
                Verdict.OK,
                "no ssh-agent (nodeprep uses the key files; fine unless a key has a passphrase)",
                "",
            )
        ]
    if v.agent_rc == 2:
        return [
            (
                "AGENT_DEAD",
                Verdict.WARN,
                f"SSH_AUTH_SOCK={v.agent_sock} but no agent answers there",
                'eval "$(ssh-agent -s)"  (or: unset SSH_AUTH_SOCK)',
            )
        ]
    return [("AGENT_OK", Verdict.OK, f"ssh-agent answers, {v.agent_keys} key(s)", "")]


def _clash_fix(d, v: View, blocks: dict) -> str:
    if d.block is not None and not blocks.get(d.block, True):
        return "invoke ssh.prune  (that block's inventory no longer exists)"
    where = f"the block of '{d.block}'" if d.block else f"your entry at {d.where}"
    want = f"{v.label}-" if v.prefix != f"{v.label}-" else f"{v.label}2-"
    return (
        f"remove {where}, or set `ssh_alias_prefix: {want}` in this inventory's vars "
        f"(now '{v.prefix}')"
    )


def ssh_config(v: View) -> list:
    out = []
    if v.config_error:
        out.append(
            (
                "CONFIG_UNREADABLE",
                Verdict.CRITICAL,
                f"{v.config_path}: {v.config_error}",
                f"chmod 600 {v.config_path}",
            )
        )
    if _loose(v.config_mode, 0o022):
        out.append(
            (
                "CONFIG_MODE",
                Verdict.CRITICAL,
                f"{v.config_path} is writable by others (mode "
                f"{v.config_mode:04o}): ssh refuses it (Bad owner or permissions)",
                f"chmod 600 {v.config_path}",
            )
        )
    alive = {name: ok for name, _line, ok in v.blocks}
    for name, line, ok in v.blocks:
        if not ok:
            out.append(
                (
                    "BLOCK_STALE",
                    Verdict.WARN,
                    f"{v.config_path}:{line}: the block of inventory "
                    f"'{name}', which no longer exists: its aliases still send ssh somewhere",
                    "invoke ssh.prune",
                )
            )
    for a in v.aliases:
        for d in a.clashes:
            out.append(
                (
                    "ALIAS_CONFLICT",
                    Verdict.CRITICAL,
                    f"Host {a.alias} is defined at {d.where} as "
                    f"{d.hostname or a.alias}:{d.port or 22}; "
                    f"this inventory has it at {a.address}:{a.port} "
                    "(provision refuses; ssh takes the first)",
                    _clash_fix(d, v, alive),
                )
            )
    return out or [
        (
            "CONFIG_OK",
            Verdict.OK,
            f"{v.config_path}: {len(v.blocks)} managed block(s), no stale one"
            + (f", {len(v.aliases)} alias(es) free" if v.aliases else ""),
            "",
        )
    ]


def python_deps(v: View) -> list:
    out = []
    if tuple(v.python[:2]) < MIN_PYTHON:
        out.append(
            (
                "PYTHON_OLD",
                Verdict.CRITICAL,
                f"Python {'.'.join(map(str, v.python))} runs nodeprep; "
                f"it needs {MIN_PYTHON[0]}.{MIN_PYTHON[1]}+",
                "sh requirements/bootstrap.sh",
            )
        )
    for name, pinned, have in v.deps:
        if have is None:
            out.append(
                (
                    "DEP_MISSING",
                    Verdict.CRITICAL,
                    f"{name} is not installed (pinned {pinned})",
                    "sh requirements/bootstrap.sh",
                )
            )
        elif have != pinned:
            out.append(
                (
                    "DEP_VERSION",
                    Verdict.WARN,
                    f"{name} {have} installed, {pinned} pinned in requirements/tool.txt",
                    "sh requirements/bootstrap.sh",
                )
            )
    return out or [
        (
            "DEPS_OK",
            Verdict.OK,
            f"Python {'.'.join(map(str, v.python))}; {len(v.deps)} pinned "
            "dependencies at their versions",
            "",
        )
    ]


def inventory(v: View) -> list:
    if v.inventory_error:
        return [("INVENTORY_REFUSED", Verdict.CRITICAL, v.inventory_error[0], v.inventory_error[1])]
    if v.inventory is None:
        return [("NO_INVENTORY", Verdict.OK, "no inventory selected: the controller only", "")]
    return [("INVENTORY_OK", Verdict.OK, f"{v.hosts} node(s) selected from {v.inventory}", "")]


def labs(v: View) -> list:
    out = [
        ("LAB_LEFTOVER", Verdict.WARN, f"lab {name}: {problem}", fix)
        for name, problem, fix in v.labs
    ]
    return out or [("LABS_OK", Verdict.OK, "no lab left half up", "")]
