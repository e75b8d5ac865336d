"""`sshconfig:[PATTERN]`: the aliases of ~/.ssh/config as nodes, read as OpenSSH reads them.

The names: every literal name on a `Host` line of the config and of every file it includes
(sshconfig_files.py: ssh's quoting and comment rules, Include with globs, `~`, nesting and
inside Host/Match blocks), in file order, each with its file:line; with PATTERN only the
names matching that glob. The values: OpenSSH's own (`ssh -G NAME`, openssh.py), so Include,
Match, `Host *` before or after, tokens and canonicalization come out as the user's own
`ssh NAME` connects: HostName is the address, then Port, User, and the first IdentityFile the
config names (tokens expanded; the first that exists, when several do). A ProxyJump or
ProxyCommand is kept and named when a command selects the node (commands/common.py: nodeprep
cannot carry a jump yet), never dropped.

OpenSSH finds ~/.ssh/config and relative includes through the passwd home, not $HOME: so does
this reader. A config ssh rejects is one error naming file:line and the fix."""

from __future__ import annotations

import fnmatch
import getpass
from pathlib import Path

from nodeprep.errors import InputError
from nodeprep.inventory import fields, openssh, sshconfig_files
from nodeprep.inventory.sources import Schema, Source, check_var
from nodeprep.inventory.yamlfile import shown_path

PROXY_KEYS = ("proxyjump", "proxycommand")
SYSTEM_CONFIG = Path("/etc/ssh/ssh_config")


def aliases(numbered) -> list[tuple[str, int]]:
    """(name, line) of every literal name on a `Host` line of one text, first occurrence
    only, from NUMBERED (line number, text) pairs, with ssh's quoting and comment rules."""
    out: list[tuple[str, int]] = []
    for number, raw in numbered:
        kw = sshconfig_files.split_keyword(raw)
        if kw is None or kw[0] != "host":
            continue
        try:
            names = sshconfig_files.arguments(kw[1])
        except ValueError:
            continue
        out += [
            (n, number)
            for n in names
            if sshconfig_files.is_alias(n) and n not in [x for x, _ in out]
        ]
    return out


def config_files(path: Path | None) -> tuple[Path, sshconfig_files.ConfigFiles, list[Path]]:
    """(the user config, what reading it found, every file `ssh -G` answers depend on: the
    system config's too when PATH is the user's own ~/.ssh/config, which plain ssh reads)."""
    home = sshconfig_files.passwd_home()
    user = path or home / ".ssh" / "config"
    if not user.exists():
        raise InputError(
            "no ssh config", "write Host entries in ~/.ssh/config first", shown_path(user)
        )
    found = sshconfig_files.read(user, home)
    depends = list(found.files)
    if path is None and SYSTEM_CONFIG.exists():
        depends += sshconfig_files.read(SYSTEM_CONFIG, home, system=True).files
    return user, found, depends


def resolved(path: Path | None, names: list[str]) -> dict[str, openssh.Resolved]:
    """NAMES as `ssh -G` answers them (`-F PATH` when a file other than the user's own is read)."""
    _user, _found, depends = config_files(path)
    return openssh.resolve(names, path, depends)


def read_sshconfig(
    src: Source, pattern: str | None, schema: Schema, path: Path | None = None
) -> None:
    src.kind = "sshconfig"
    user_config, found, depends = config_files(path)
    chosen = [a for a in found.aliases if not pattern or fnmatch.fnmatchcase(a.name, pattern)]
    if not chosen:
        raise InputError(
            f"no Host entry{' matches ' + repr(pattern) if pattern else ''} in the "
            "ssh config or the files it includes",
            "sshconfig:PATTERN takes a glob such as 'gpu*'",
            shown_path(user_config),
        )
    for alias in chosen:  # before ssh sees it: a name the inventory could not carry
        problem = fields.name_problem(alias.name)
        if problem:
            raise InputError(problem, fields.ALIAS_HINT, alias.file, alias.line)
    got = openssh.resolve([a.name for a in chosen], path, depends)
    defaults = openssh.default_identities()
    home, me = sshconfig_files.passwd_home(), getpass.getuser()
    for alias in chosen:
        src.hosts[alias.name] = alias.origin
        src.entry_vars[alias.name] = _entry(alias, got[alias.name], schema, (defaults, home, me))


def _entry(alias: sshconfig_files.Alias, r: openssh.Resolved, schema: Schema, ids: tuple) -> dict:
    """The inventory variables of one alias from ssh's answer R, each with the alias's origin."""
    defaults, home, me = ids
    where, entry = alias.origin, {}
    values = {
        "address": r.hostname if r.hostname != alias.name else None,
        "port": r.port,
        "user": r.user,
    }
    for var, value in values.items():
        if value is not None:
            name, checked = check_var(var, value, schema, alias.file, alias.line)
            entry[name] = (checked, where)
    configured = r.identity_files if r.identity_files != defaults else []
    if configured:
        paths = [openssh.identity_path(v, r, me, home) for v in configured]
        entry["key"] = (next((p for p in paths if Path(p).is_file()), paths[0]), where)
    for key in PROXY_KEYS:
        value = getattr(r, key)
        if value:
            entry[key] = (value, where)
    return entry
