"""Ansible's inventory semantics, shared by the YAML reader here and the INI reader (ini.py):
groups as Ansible's yaml plugin walks them, host keys with ports and ranges
(addresses.py), and the order in which group variables apply (group_order)."""

from __future__ import annotations

import shlex

from nodeprep.errors import InputError
from nodeprep.inventory import addresses
from nodeprep.inventory.sources import (
    GROUP_KEYS,
    Schema,
    Source,
    Vars,
    read_vars,
    split_origin,
    suggest,
)
from nodeprep.inventory.yamlfile import LineDict


def read_ansible(src: Source, data: LineDict, schema: Schema):
    """An Ansible YAML inventory, read as Ansible's yaml plugin reads it."""
    src.ansible, src.kind = True, "ansible-yaml"
    if "plugin" in data:
        name = shlex.quote(data.file)
        raise InputError(
            "this is the configuration of an Ansible inventory plugin, not an inventory",
            f"let Ansible run the plugin, then give nodeprep what it "
            f"found: `ansible-inventory -i {name} --list > hosts.json` and "
            "--inventory hosts.json",
            data.file,
            data.line_of("plugin"),
        )
    for group, body in data.items():
        _walk_group(src, str(group), body, schema, data.file, data.line_of(group))


def _section(body: LineDict, key: str, group: str):
    """A group's hosts:/children:/vars: as a mapping (a bare string is one key)."""
    value = body.get(key)
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        one = LineDict({str(value): None})
        one.file, one.line = body.file, body.line_of(key)
        one.lines[str(value)] = body.line_of(key)
        return one
    if value is not None and not isinstance(value, LineDict):
        raise InputError(
            f"the {key} of group '{group}' must be a mapping",
            f"write `{key}: {{name: ...}}`",
            body.file,
            body.line_of(key),
        )
    return value


def _walk_group(src: Source, group: str, body, schema: Schema, file: str, line: int):
    where = f"{file}:{line}"
    if body is not None and not isinstance(body, LineDict):
        src.warn(
            f"{where}: '{group}' is not a group (a mapping of hosts:, children:, "
            f"vars:) and is skipped, as Ansible does"
        )
        return
    if group != "all":
        src.add_group(group, where)
    if body is None:
        return
    sections = {key: _section(body, key, group) for key in GROUP_KEYS if key in body}
    for key in body:
        if key not in GROUP_KEYS:
            hint = suggest(key, GROUP_KEYS, "a group has hosts:, children: and vars:")
            src.warn(
                f"{file}:{body.line_of(key)}: key '{key}' in group '{group}' is skipped, "
                f"as Ansible does ({hint})"
            )
    for section in body:  # in file order, as Ansible adds them
        if section == "vars":
            group_vars = read_vars(sections["vars"], schema, file, body.line_of("vars"), src)
            (src.wide if group == "all" else src.group_vars.setdefault(group, {})).update(
                group_vars
            )
        elif section == "children":
            children = sections["children"] or {}
            for child, child_body in children.items():
                _walk_group(src, str(child), child_body, schema, file, children.line_of(child))
                src.add_child(group, str(child), f"{file}:{children.line_of(child)}")
        elif section == "hosts":
            _group_hosts(src, group, sections["hosts"] or {}, schema, file)


def _group_hosts(src: Source, group: str, hosts: LineDict, schema: Schema, file: str):
    for key, host_body in hosts.items():
        at = hosts.line_of(key)
        if host_body is not None and not isinstance(host_body, LineDict):
            raise InputError(
                f"host '{key}' in group '{group}': its variables must be a mapping",
                "write `name: {var: value}` or `name:` alone",
                file,
                at,
            )
        if not isinstance(key, str):
            raise InputError(
                f"host name {key!r} in group '{group}' is not a string",
                f'quote it: "{key}":',
                file,
                at,
            )
        add_hosts(src, key, read_vars(host_body, schema, file, at, src), group, (file, at))


def add_hosts(src: Source, key: str, entry: Vars, group: str, where: tuple[str, int]) -> None:
    """Add the hosts of an Ansible host KEY to GROUP with their ENTRY variables. A `:PORT`
    in the key counts where a host is first defined only (a port variable always wins), as
    in Ansible; a range that expands to no host is a warning (Ansible says nothing)."""
    file, line = where
    try:
        names, port = addresses.host_pattern(key)
    except addresses.RangeError as exc:
        raise InputError(
            f"bad host range {exc}",
            "Ansible ranges look like web[01:50], web[01:50:2] or db-[a:f]",
            file,
            line,
        ) from None
    if port is not None and not 1 <= port <= 65535:
        raise InputError(f"host '{key}': port {port} is not 1..65535", "fix the port", file, line)
    if not names:
        src.warn(f"{file}:{line}: '{key}' expands to no host (the range goes backwards)")
    for name in names:
        if port is not None and name not in src.hosts and name not in src.outer_hosts:
            src.key_ports[name] = (port, f"{file}:{line}")
        src.add_host(name, f"{file}:{line}", group, entry)


def group_order(src: Source) -> dict[str, tuple]:
    """Ansible's sort key of every group: (depth, priority, name); `all` has depth 0, a
    group without a parent depth 1, a child one more than its deepest parent."""
    parents: dict[str, list[str]] = {}
    for parent, kids in src.children.items():
        for kid in kids:
            parents.setdefault(kid, []).append(parent)
    depth: dict[str, int] = {"all": 0}

    def depth_of(group: str, path: tuple) -> int:
        if group in path:
            raise InputError(
                f"group '{group}' is its own ancestor ({' -> '.join(path + (group,))})",
                "remove one of the children: entries",
                *split_origin(src.group_lines.get(group, "")),
            )
        if group not in depth:
            ups = [p for p in parents.get(group, []) if p != group]
            depth[group] = 1 + max([depth_of(p, path + (group,)) for p in ups] or [0])
        return depth[group]

    out = {"all": (0, 1, "all")}
    for group in [*src.groups, "ungrouped"]:
        prio = (src.group_vars.get(group, {}).get("ansible_group_priority") or (1,))[0]
        try:
            prio = int(prio)
        except (TypeError, ValueError):
            prio = 1
        out[group] = (depth_of(group, ()), prio, group)
    return out
