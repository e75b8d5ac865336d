"""`sshconfig:[PATTERN]`: the aliases of ~/.ssh/config as nodes.

Every name on a `Host` line without a wildcard or `!` becomes a node (in file order; with
PATTERN, only names matching that glob), resolved by paramiko's SSHConfig exactly as ssh
would resolve it (first value wins, `Host *` defaults apply): HostName is the address, and
Port, User and IdentityFile are taken when the config sets them. A ProxyJump or
ProxyCommand is kept and named when a command selects the node (nodeprep connects directly).
"""
from __future__ import annotations

import fnmatch
from pathlib import Path

import paramiko
from paramiko.ssh_exception import ConfigParseError, CouldNotCanonicalize

from nodeprep.errors import InputError
from nodeprep.inventory.ini import read_text
from nodeprep.inventory.sources import Schema, Source, check_var
from nodeprep.inventory.yamlfile import shown_path

PROXY_KEYS = ("proxyjump", "proxycommand")


def aliases(numbered) -> list[tuple[str, int]]:
    """(name, line) of every literal name on a `Host` line, first occurrence only, from
    NUMBERED (line number, text) pairs: wildcards and negations are patterns, not aliases."""
    out: list[tuple[str, int]] = []
    for number, raw in numbered:
        words = raw.strip().replace("=", " ", 1).split()
        if len(words) < 2 or words[0].lower() != "host":
            continue
        for name in words[1:]:
            name = name.strip('"')
            if not any(c in name for c in "*?!") and name not in [n for n, _ in out]:
                out.append((name, number))
    return out


def read_sshconfig(src: Source, pattern: str | None, schema: Schema,
                   path: Path | None = None) -> None:
    src.kind = "sshconfig"
    path = path or Path.home() / ".ssh" / "config"
    file = shown_path(path)
    lines, config = _parse(path, file)
    for name, number in aliases(enumerate(lines, 1)):
        if pattern and not fnmatch.fnmatchcase(name, pattern):
            continue
        found = _lookup(config, name, file, number)
        entry = {}
        for key, var in (("hostname", "address"), ("port", "port"), ("user", "user")):
            if key in found and not (key == "hostname" and found[key] == name):
                var_name, value = check_var(var, found[key], schema, file, number)
                entry[var_name] = (value, f"{file}:{number}")
        if found.get("identityfile"):
            entry["key"] = (str(Path(found["identityfile"][0]).expanduser()), f"{file}:{number}")
        for key in PROXY_KEYS:
            if key in found:
                entry[key] = (found[key], f"{file}:{number}")
        src.hosts[name] = f"{file}:{number}"
        src.entry_vars[name] = entry
    if not src.hosts:
        raise InputError(f"no Host entry{' matches ' + repr(pattern) if pattern else ''} in the "
                         "ssh config", "sshconfig:PATTERN takes a glob such as 'gpu*'", file)


def _parse(path: Path, file: str) -> tuple[list[str], paramiko.SSHConfig]:
    """The config's lines (read as every inventory is: UTF-8, no control characters) and
    paramiko's reading of them; InputError naming the line paramiko cannot parse."""
    if not path.exists():
        raise InputError("no ssh config", "write Host entries in ~/.ssh/config first", file)
    lines = read_text(path)
    try:
        return lines, paramiko.SSHConfig.from_text("\n".join(lines))
    except (ValueError, ConfigParseError) as exc:     # ValueError: shlex, an unclosed quote
        number = next((n for n, line in enumerate(lines, 1) if not _parses(line)), None)
        raise InputError(f"cannot read the ssh config: {exc}",
                         "fix that line (see `man ssh_config`)", file, number) from None


def _parses(line: str) -> bool:
    """Does LINE parse alone? (paramiko's errors are all about one line.)"""
    try:
        paramiko.SSHConfig.from_text(line)
    except (ValueError, ConfigParseError):
        return False
    return True


def _lookup(config: paramiko.SSHConfig, name: str, file: str, number: int):
    """NAME's options as ssh resolves them; InputError (at NAME's Host line) for options
    paramiko cannot resolve: CanonicalizeHostname without CanonicalDomains, a
    CanonicalizeMaxDots that is no number, a name that cannot be canonicalized."""
    try:
        return config.lookup(name)
    except (ValueError, KeyError, OSError, CouldNotCanonicalize) as exc:
        why = f"{exc.args[0]} is not set" if isinstance(exc, KeyError) else (
            f"cannot canonicalize {exc}" if isinstance(exc, CouldNotCanonicalize) else str(exc))
        raise InputError(f"host '{name}': the ssh config cannot be resolved for it: {why}",
                         "fix the Canonicalize* (or Match) options that apply to it", file,
                         number) from None
