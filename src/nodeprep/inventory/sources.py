"""Readers for each inventory form. Each fills a Source: what was written, and where.

Variables are checked against the schema as they are read, while their file and line
are at hand, so every error can point at the line to fix. Precedence is applied later,
by inventory.py, from the layers kept apart here.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path

from nodeprep.inventory import nodeset
from nodeprep.errors import InputError
from nodeprep.inventory.schema import VarSpec, check_value, normalize
from nodeprep.inventory.yamlfile import LineDict, LineList, display, load_yaml

Vars = dict  # variable -> (value, origin "file:line" or "cli")
Schema = dict[str, VarSpec]

NATIVE_KEYS = ("vars", "hosts", "groups")
GROUP_KEYS = ("hosts", "children", "vars")
# Ansible's connection variables that mean the same as a core variable; other ansible_*
# keys (become, ssh args, ...) have no nodeprep meaning and are ignored, so an Ansible
# inventory loads unchanged.
ANSIBLE_NAMES = {"ansible_host": "address", "ansible_port": "port", "ansible_user": "user",
                 "ansible_ssh_private_key_file": "key",
                 "ansible_python_interpreter": "python"}
_HOSTFILE_LINE = re.compile(r"^(\S+)\s+slots=(\d+)$")


@dataclass
class Source:
    name: str
    path: Path | None
    base: Path                                                   # where relative keys start
    hosts: dict[str, str] = field(default_factory=dict)          # host -> "file:line", in order
    entry_vars: dict[str, Vars] = field(default_factory=dict)    # vars on the host's entry
    groups: dict[str, list[str]] = field(default_factory=dict)   # in order of appearance
    children: dict[str, list[str]] = field(default_factory=dict)
    wide: Vars = field(default_factory=dict)                     # `vars:` and group `all`
    group_vars: dict[str, Vars] = field(default_factory=dict)
    group_files: dict[str, Vars] = field(default_factory=dict)
    host_files: dict[str, Vars] = field(default_factory=dict)


def suggest(word, choices, fallback: str) -> str:
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1)
    return f"did you mean '{close[0]}'?" if close else fallback


def check_var(key, value, schema: Schema, file: str | None, line: int | None,
              label: str = "variable"):
    """(name, value) with Ansible names mapped and digit strings made numbers, or None."""
    name = ANSIBLE_NAMES.get(key, key)
    if isinstance(name, str) and name.startswith("ansible_"):
        return None
    spec = schema.get(name)
    if spec is None:
        raise InputError(f"unknown {label} '{key}'",
                         suggest(key, schema, "variables are defined in "
                                 "src/nodeprep/defaults.yml and roles/*/defaults.yml"),
                         file, line)
    reason = check_value(spec, value)
    if reason:
        raise InputError(f"{label} '{key}': {reason}", f"{name} is documented at "
                         f"{spec.source}", file, line)
    return name, normalize(spec, value)


def read_vars(data, schema: Schema, file: str, line: int | None = None) -> Vars:
    if data is None:
        return {}
    if not isinstance(data, LineDict):
        raise InputError("variables must be a mapping of name: value",
                         "write one `name: value` per line", file,
                         getattr(data, "line", line))
    out: Vars = {}
    for key, value in data.items():
        checked = check_var(key, value, schema, data.file, data.line_of(key))
        if checked:
            out[checked[0]] = (checked[1], f"{data.file}:{data.line_of(key)}")
    return out


def _mapping(data, what: str, example: str, file: str, line: int) -> LineDict:
    if data is None:
        return LineDict()
    if not isinstance(data, LineDict):
        raise InputError(f"{what} must be a mapping", f"write it as {example}", file,
                         getattr(data, "line", line))
    return data


def _expand(pattern, file: str, line: int) -> list[str]:
    try:
        return nodeset.expand(str(pattern))
    except ValueError as exc:
        raise InputError(str(exc), "ranges look like node[1-4], node[01-04,07] or "
                         "node[01:04]", file, line) from None


def _add_hosts(src: Source, hosts, schema: Schema, file: str, line: int, shared: bool):
    """Hosts of one `hosts:` mapping. `shared`: Ansible layout, where one host may be
    listed under several groups, but its vars may only be given in one place."""
    added: list[str] = []
    hosts = _mapping(hosts, "hosts", "`hosts: {node1: {port: 22}, node[2-4]: null}`",
                     file, line)
    for pattern, body in hosts.items():
        at = hosts.line_of(pattern)
        entry_vars = read_vars(body, schema, file, at)
        for name in _expand(pattern, file, at):
            if name in added or (name in src.hosts and not shared):
                first = src.hosts[name].rsplit(":", 1)[1]
                raise InputError(f"host '{name}' is defined twice (first at line {first})",
                                 "define each host once; check overlapping ranges", file, at)
            if entry_vars and src.entry_vars.get(name):
                raise InputError(f"host '{name}' has variables in two places (first at "
                                 f"{src.hosts[name]})", f"keep them in one place, or in "
                                 f"host_vars/{name}.yml", file, at)
            src.hosts.setdefault(name, f"{file}:{at}")
            if entry_vars:
                src.entry_vars[name] = entry_vars
            added.append(name)
    return added


def read_native(src: Source, data: LineDict, schema: Schema):
    file = data.file
    for key in data:
        if key not in NATIVE_KEYS:
            raise InputError(f"unknown top-level key '{key}'",
                             suggest(key, NATIVE_KEYS, "the top-level keys are hosts:, "
                                     "groups: and vars:"), file, data.line_of(key))
    src.wide.update(read_vars(data.get("vars"), schema, file, data.line_of("vars")))
    _add_hosts(src, data.get("hosts"), schema, file, data.line_of("hosts"), shared=False)
    groups = _mapping(data.get("groups"), "groups", "`groups: {gpus: {hosts: [gpu01]}}`",
                      file, data.line_of("groups"))
    for group, body in groups.items():
        body = _mapping(body, f"group '{group}'", "`{hosts: [node1], vars: {...}}`", file,
                        groups.line_of(group))
        for key in body:
            if key not in ("hosts", "vars"):
                raise InputError(f"unknown key '{key}' in group '{group}'",
                                 suggest(key, ("hosts", "vars"), "a group has hosts: and vars:"),
                                 file, body.line_of(key))
        group_vars = read_vars(body.get("vars"), schema, file, body.line_of("vars"))
        members = body.get("hosts") or LineList()
        if not isinstance(members, list):
            raise InputError(f"hosts of group '{group}' must be a list",
                             "write it as `hosts: [node1, \"node[2-4]\"]`", file,
                             body.line_of("hosts"))
        names = []
        for index, pattern in enumerate(members):
            at = members.line_of(index)
            for name in _expand(pattern, file, at):
                if name not in src.hosts:
                    raise InputError(f"group '{group}' lists unknown host '{name}'",
                                     suggest(name, src.hosts, "define it under hosts: first"),
                                     file, at)
                names.append(name)
        if group == "all":
            src.wide.update(group_vars)
            continue
        group_hosts = src.groups.setdefault(group, [])
        for name in names:
            if name not in group_hosts:
                group_hosts.append(name)
        src.group_vars.setdefault(group, {}).update(group_vars)


def read_ansible(src: Source, data: LineDict, schema: Schema):
    for group, body in data.items():
        if group not in ("all", "ungrouped") and difflib.get_close_matches(
                str(group), NATIVE_KEYS, n=1, cutoff=0.8):
            raise InputError(f"unknown top-level key '{group}'",
                             suggest(group, NATIVE_KEYS, ""), data.file, data.line_of(group))
        _walk_group(src, str(group), body, schema, data.file, data.line_of(group))
    for group in src.groups:
        src.groups[group] = _members(src, group, set())


def _walk_group(src: Source, group: str, body, schema: Schema, file: str, line: int):
    body = _mapping(body, f"group '{group}'", "`all: {hosts: {...}, children: {...}, "
                    "vars: {...}}`, or use the top-level keys hosts:, groups:, vars:",
                    file, line)
    for key in body:
        if key not in GROUP_KEYS:
            raise InputError(f"unknown key '{key}' in group '{group}'",
                             suggest(key, GROUP_KEYS, "a group has hosts:, children: and vars:"),
                             file, body.line_of(key))
    group_vars = read_vars(body.get("vars"), schema, file, body.line_of("vars"))
    if group == "all":
        src.wide.update(group_vars)
    else:
        src.group_vars.setdefault(group, {}).update(group_vars)
        src.groups.setdefault(group, [])
    added = _add_hosts(src, body.get("hosts"), schema, file, body.line_of("hosts"), shared=True)
    if group != "all":
        src.groups[group].extend(added)
    children = _mapping(body.get("children"), f"children of '{group}'",
                        "`children: {gpus: {hosts: {...}}}`", file, body.line_of("children"))
    for child, child_body in children.items():
        src.children.setdefault(group, []).append(str(child))
        _walk_group(src, str(child), child_body, schema, file, children.line_of(child))


def _members(src: Source, group: str, seen: set) -> list[str]:
    """A group's hosts, its children's included; `seen` stops a group containing itself."""
    seen.add(group)
    names = list(src.groups.get(group, []))
    for child in src.children.get(group, []):
        if child not in seen:
            names.extend(n for n in _members(src, child, seen) if n not in names)
    return names


def read_side_files(src: Source, directory: Path, schema: Schema):
    """group_vars/<group>.yml (or group_vars/<group>/*.yml) and host_vars/<host>.yml."""
    for folder, known, target in (("group_vars", [*src.groups, "all"], src.group_files),
                                  ("host_vars", list(src.hosts), src.host_files)):
        for entry in sorted((directory / folder).glob("*")):
            if entry.is_dir():
                files = sorted(p for p in entry.iterdir() if p.suffix in (".yml", ".yaml"))
                name = entry.name
            elif entry.suffix in (".yml", ".yaml"):
                files, name = [entry], entry.stem
            else:
                continue
            if name not in known:
                what = "group" if folder == "group_vars" else "host"
                raise InputError(f"no {what} '{name}' in the inventory",
                                 suggest(name, known, "rename the file or remove it"),
                                 display(entry))
            for path in files:
                target.setdefault(name, {}).update(
                    read_vars(load_yaml(path), schema, display(path), 1))


def read_hostfile(src: Source, path: Path, schema: Schema):
    """DeepSpeed/MPI hostfile: `worker-1 slots=8` per line."""
    file = display(path)
    for number, text in _lines(path):
        match = _HOSTFILE_LINE.match(text)
        if not match:
            raise InputError(f"not a hostfile line: '{text}'",
                             "write `HOST slots=N`, e.g. `worker-1 slots=8`", file, number)
        name, slots = match.groups()
        if name in src.hosts:
            raise InputError(f"host '{name}' is listed twice (first at "
                             f"{src.hosts[name]})", "list each host once", file, number)
        checked = check_var("slots", slots, schema, file, number)
        src.hosts[name] = f"{file}:{number}"
        src.entry_vars[name] = {"slots": (checked[1], f"{file}:{number}")}
    if not src.hosts:
        raise InputError("no hosts in the hostfile", "add lines like `worker-1 slots=8`", file)


def read_pbs(src: Source, path: Path):
    """PBS nodefile: one line per slot, so a node's name repeats once per slot."""
    file = display(path)
    for number, text in _lines(path):
        if len(text.split()) != 1:
            raise InputError(f"not a PBS nodefile line: '{text}'",
                             "write one host name per line, repeated once per slot",
                             file, number)
        src.hosts.setdefault(text, f"{file}:{number}")
        slots = src.entry_vars.setdefault(text, {}).get("slots", (0, ""))[0] + 1
        src.entry_vars[text]["slots"] = (slots, src.hosts[text])
    if not src.hosts:
        raise InputError("no hosts in the PBS nodefile", "is $PBS_NODEFILE the right file?",
                         file)


def read_slurm(src: Source, nodelist: str):
    try:
        names = nodeset.split_list(nodelist)
    except ValueError as exc:
        raise InputError(f"bad Slurm node list '{nodelist}': {exc}",
                         "it looks like gpu[01-04,07],cpu1") from None
    for name in names:
        if name in src.hosts:
            raise InputError(f"host '{name}' is listed twice in the Slurm node list "
                             f"'{nodelist}'", "list each host once")
        src.hosts[name] = "slurm"
    if not src.hosts:
        raise InputError("the Slurm node list is empty", "is this a Slurm allocation?")


def _lines(path: Path):
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read: {exc}", "check the path", display(path)) from None
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if line:
            yield number, line
