"""Readers for each inventory form. Each fills a Source: what was written, and where.

Variables are checked against the schema as they are read, while their file and line
are at hand, so every error can point at the line to fix. Precedence is applied later,
by inventory.py, from the layers kept apart here.
"""

from __future__ import annotations

import difflib
import errno
from dataclasses import dataclass, field
from pathlib import Path

from nodeprep.errors import InputError
from nodeprep.inventory import connvars, nodeset
from nodeprep.inventory.jsonfile import load_file
from nodeprep.inventory.schema import VarSpec, check_value, normalize
from nodeprep.inventory.yamlfile import LineDict, LineList, shown_path

Vars = dict  # variable -> (value, origin "file:line" or "cli")
Schema = dict[str, VarSpec]

NATIVE_KEYS = ("vars", "hosts", "groups")
GROUP_KEYS = ("hosts", "children", "vars")
# Ansible's connection variables that mean the same as a core variable (inventory/connvars.py
# classifies every one Ansible's ssh connection reads). The ansible_ssh_* spellings that win
# over the plain ones (connvars.STRONG) keep their own name until the levels are merged
# (inventory.model). Other variables of an Ansible inventory (playbook variables) are kept,
# shown by `invoke inventory --host`, and not used.
ANSIBLE_NAMES = connvars.WEAK
# ansible_connection values: the ones that mean ssh, and local. Others are kept as written
# and refused when a command selects the host (commands.common).
_CONNECTIONS = {
    "ssh": "ssh",
    "smart": "ssh",
    "paramiko": "ssh",
    "paramiko_ssh": "ssh",
    "local": "local",
}


@dataclass
class Source:
    name: str
    path: Path | None
    base: Path  # where relative keys start
    ansible: bool = False  # Ansible semantics apply
    kind: str = "native"  # what was read, for the user
    hosts: dict[str, str] = field(default_factory=dict)  # host -> "file:line", in order
    entry_vars: dict[str, Vars] = field(default_factory=dict)  # vars on the host's entry
    groups: dict[str, list[str]] = field(default_factory=dict)  # direct hosts, in order
    children: dict[str, list[str]] = field(default_factory=dict)
    wide: Vars = field(default_factory=dict)  # `vars:` and group `all`
    group_vars: dict[str, Vars] = field(default_factory=dict)
    group_files: dict[str, Vars] = field(default_factory=dict)
    host_files: dict[str, Vars] = field(default_factory=dict)
    group_lines: dict[str, str] = field(default_factory=dict)  # group -> where defined
    key_ports: dict[str, tuple] = field(default_factory=dict)  # host -> port of `host:PORT`
    warnings: list[str] = field(default_factory=list)
    # what earlier files of the same directory defined (one Ansible inventory, read in turns)
    outer_groups: set = field(default_factory=set)
    outer_hosts: set = field(default_factory=set)

    def warn(self, text: str) -> None:
        if text not in self.warnings:
            self.warnings.append(text)

    def add_host(self, name: str, where: str, group: str | None, entry: Vars) -> None:
        """Ansible's add_host: a host may be listed again (in another group, another file);
        its variables accumulate, the later value of a variable winning."""
        self.hosts.setdefault(name, where)
        if entry:
            self.entry_vars.setdefault(name, {}).update(entry)
        if group and group != "all":
            members = self.add_group(group, where)
            if name not in members:
                members.append(name)

    def add_group(self, group: str, where: str) -> list[str]:
        self.group_lines.setdefault(group, where)
        return self.groups.setdefault(group, [])

    def add_child(self, parent: str, child: str, where: str) -> None:
        self.add_group(child, where)
        if parent != "all":
            self.add_group(parent, where)
        kids = self.children.setdefault(parent, [])
        if child not in kids:
            kids.append(child)

    def merge(self, other: "Source") -> None:
        """Add a later source of one inventory directory (its values win, as in Ansible)."""
        self.ansible = self.ansible or other.ansible
        for name, where in other.hosts.items():
            if name in other.key_ports and name not in self.hosts:
                self.key_ports[name] = other.key_ports[name]
            self.add_host(name, where, None, other.entry_vars.get(name, {}))
        for group, names in other.groups.items():
            members = self.add_group(group, other.group_lines.get(group, ""))
            members.extend(n for n in names if n not in members)
        for parent, kids in other.children.items():
            for kid in kids:
                self.add_child(parent, kid, other.group_lines.get(kid, ""))
        self.wide.update(other.wide)
        for group, layer in other.group_vars.items():
            self.group_vars.setdefault(group, {}).update(layer)
        for text in other.warnings:
            self.warn(text)


def split_origin(where: str) -> tuple[str | None, int | None]:
    """(file, line) of an origin "file:line"; (None, None) for "cli", "slurm" and the like."""
    file, _, line = where.rpartition(":")
    return ((file or None), int(line)) if line.isdigit() else (None, None)


def suggest(word, choices, fallback: str) -> str:
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1)
    return f"did you mean '{close[0]}'?" if close else fallback


def check_var(
    key, value, schema: Schema, file: str | None, line: int | None, src: Source | None = None
):
    """(name, value) with Ansible names mapped and digit strings made numbers, or None for
    a variable that is ignored. With an Ansible-format SRC a variable nodeprep does not know
    is kept as written (a near-miss of a nodeprep variable gets a warning); otherwise it is
    an error. Without FILE the value came from the command line (an "extra variable")."""
    key, label = str(key), "variable" if file else "extra variable"
    if key in connvars.STRONG:  # validated as what it means, kept under its own name
        spec = schema[connvars.STRONG[key]]
        reason = check_value(spec, value)
        if reason:
            raise InputError(
                f"{label} '{key}': {reason}",
                f"{spec.name} is documented at {spec.source}",
                file,
                line,
            )
        return key, normalize(spec, value)
    name = ANSIBLE_NAMES.get(key, key)
    if name == "connection" and key.startswith("ansible_") and isinstance(value, str):
        value = _CONNECTIONS.get(value.strip(), value.strip())
    ansible = src is not None and src.ansible
    if name.startswith("ansible_") and not ansible:
        return (key, value) if key in connvars.TABLE else None  # refused or listed as ignored
    spec = schema.get(name)
    if spec is None:
        if not ansible:
            raise InputError(
                f"unknown {label} '{key}'",
                suggest(
                    key,
                    schema,
                    "variables are defined in "
                    "src/nodeprep/inventory/defaults.yml and roles/*/defaults.yml",
                ),
                file,
                line,
            )
        close = difflib.get_close_matches(key, list(schema), n=1, cutoff=0.8)
        if close and not key.startswith("ansible_"):
            where = f"{file}:{line}: " if line else (f"{file}: " if file else "")
            src.warn(
                f"{where}variable '{key}' is not a nodeprep variable and is ignored; "
                f"did you mean '{close[0]}'?"
            )
        return key, value
    reason = check_value(spec, value)
    if reason:
        raise InputError(
            f"{label} '{key}': {reason}", f"{name} is documented at {spec.source}", file, line
        )
    return name, normalize(spec, value)


def read_vars(
    data, schema: Schema, file: str, line: int | None = None, src: Source | None = None
) -> Vars:
    if data is None:
        return {}
    if not isinstance(data, LineDict):
        raise InputError(
            "variables must be a mapping of name: value",
            "write one `name: value` per line",
            file,
            getattr(data, "line", line),
        )
    out: Vars = {}
    for key, value in data.items():
        checked = check_var(key, value, schema, data.file, data.line_of(key), src=src)
        if checked:
            out[checked[0]] = (checked[1], f"{data.file}:{data.line_of(key)}")
    return out


def _mapping(data, what: str, example: str, file: str, line: int) -> LineDict:
    if data is None:
        return LineDict()
    if not isinstance(data, LineDict):
        raise InputError(
            f"{what} must be a mapping", f"write it as {example}", file, getattr(data, "line", line)
        )
    return data


def _expand(pattern, file: str, line: int) -> list[str]:
    try:
        return nodeset.expand(str(pattern))
    except ValueError as exc:
        raise InputError(
            str(exc), "ranges look like node[1-4], node[01-04,07] or node[01:04]", file, line
        ) from None


def _add_hosts(src: Source, hosts, schema: Schema, file: str, line: int):
    """Hosts of one native `hosts:` mapping: each defined once, its vars in one place."""
    added: list[str] = []
    hosts = _mapping(hosts, "hosts", "`hosts: {node1: {port: 22}, node[2-4]: null}`", file, line)
    for pattern, body in hosts.items():
        at = hosts.line_of(pattern)
        entry_vars = read_vars(body, schema, file, at)
        for name in _expand(pattern, file, at):
            if name in added or name in src.hosts:
                first = src.hosts[name].rsplit(":", 1)[1]
                raise InputError(
                    f"host '{name}' is defined twice (first at line {first})",
                    "define each host once; check overlapping ranges",
                    file,
                    at,
                )
            if entry_vars and src.entry_vars.get(name):
                raise InputError(
                    f"host '{name}' has variables in two places (first at {src.hosts[name]})",
                    f"keep them in one place, or in host_vars/{name}.yml",
                    file,
                    at,
                )
            src.hosts.setdefault(name, f"{file}:{at}")
            if entry_vars:
                src.entry_vars[name] = entry_vars
            added.append(name)
    return added


def read_native(src: Source, data: LineDict, schema: Schema):
    file = data.file
    for key in data:
        if key not in NATIVE_KEYS:
            raise InputError(
                f"unknown top-level key '{key}'",
                suggest(key, NATIVE_KEYS, "the top-level keys are hosts:, groups: and vars:"),
                file,
                data.line_of(key),
            )
    src.wide.update(read_vars(data.get("vars"), schema, file, data.line_of("vars")))
    _add_hosts(src, data.get("hosts"), schema, file, data.line_of("hosts"))
    groups = _mapping(
        data.get("groups"),
        "groups",
        "`groups: {gpus: {hosts: [gpu01]}}`",
        file,
        data.line_of("groups"),
    )
    for group, body in groups.items():
        body = _mapping(
            body, f"group '{group}'", "`{hosts: [node1], vars: {...}}`", file, groups.line_of(group)
        )
        for key in body:
            if key not in ("hosts", "vars"):
                raise InputError(
                    f"unknown key '{key}' in group '{group}'",
                    suggest(key, ("hosts", "vars"), "a group has hosts: and vars:"),
                    file,
                    body.line_of(key),
                )
        group_vars = read_vars(body.get("vars"), schema, file, body.line_of("vars"))
        members = body.get("hosts") or LineList()
        if not isinstance(members, list):
            raise InputError(
                f"hosts of group '{group}' must be a list",
                'write it as `hosts: [node1, "node[2-4]"]`',
                file,
                body.line_of("hosts"),
            )
        names = []
        for index, pattern in enumerate(members):
            at = members.line_of(index)
            for name in _expand(pattern, file, at):
                if name not in src.hosts:
                    raise InputError(
                        f"group '{group}' lists unknown host '{name}'",
                        suggest(name, src.hosts, "define it under hosts: first"),
                        file,
                        at,
                    )
                names.append(name)
        if group == "all":
            src.wide.update(group_vars)
            continue
        group_hosts = src.groups.setdefault(group, [])
        for name in names:
            if name not in group_hosts:
                group_hosts.append(name)
        src.group_vars.setdefault(group, {}).update(group_vars)


VARS_EXTENSIONS = ("", ".yml", ".yaml", ".json")


def _dir_files(folder: Path) -> list[Path]:
    """Files under a vars directory in Ansible's order: sorted, recursively, hidden and
    `~` backups skipped, each with no extension or .yml, .yaml, .json."""
    out: list[Path] = []
    for child in sorted(folder.iterdir()):
        if child.name.startswith(".") or child.name.endswith("~"):
            continue
        if child.is_dir() and not child.suffix:
            out.extend(_dir_files(child))
        elif child.is_file() and child.suffix in VARS_EXTENSIONS:
            out.append(child)
    return out


def vars_files(folder: Path, name: str) -> list[Path]:
    """Ansible's lookup of NAME in group_vars/ or host_vars/: the first of NAME, NAME.yml,
    NAME.yaml, NAME.json that exists (a directory: every file under it). A name no file can
    have (a '/', a NUL, '.' or '..', over 255 bytes) has none: a name never reaches outside
    FOLDER."""
    if "/" in name or "\0" in name or name in (".", ".."):
        return []
    for ext in VARS_EXTENSIONS:
        path = folder / f"{name}{ext}"
        try:
            if path.is_dir():
                return _dir_files(path)
            if path.is_file():
                return [path]
        except OSError as exc:
            if exc.errno == errno.ENAMETOOLONG:
                return []
            raise InputError(
                f"cannot read: {exc.strerror}", "check the permissions", shown_path(path)
            ) from None
    return []


def read_side_files(src: Source, directory: Path, schema: Schema):
    """group_vars/<group> and host_vars/<host> beside the inventory (see vars_files). An
    entry for a name the inventory does not have is an error in a native inventory and a
    warning in an Ansible one (Ansible never looks at it)."""
    for folder, known, target in (
        ("group_vars", ["all", *src.groups, "ungrouped"], src.group_files),
        ("host_vars", list(src.hosts), src.host_files),
    ):
        where = directory / folder
        if not where.is_dir():
            continue
        for name in known:
            for path in vars_files(where, name):
                target.setdefault(name, {}).update(
                    read_vars(load_file(path), schema, shown_path(path), 1, src)
                )
        names = set(known)
        for entry in sorted(where.iterdir()):
            stem = (
                entry.name[: len(entry.name) - len(entry.suffix)]
                if entry.suffix in VARS_EXTENSIONS
                else None
            )
            if (
                entry.name in names
                or stem in names
                or entry.name.startswith(".")
                or not (entry.is_dir() or stem is not None)
            ):
                continue
            what = "group" if folder == "group_vars" else "host"
            if src.ansible:
                src.warn(
                    f"{shown_path(entry)}: no {what} '{stem or entry.name}' in the "
                    "inventory; ignored, as Ansible does"
                )
                continue
            raise InputError(
                f"no {what} '{stem or entry.name}' in the inventory",
                suggest(stem or entry.name, known, "rename the file or remove it"),
                shown_path(entry),
            )
