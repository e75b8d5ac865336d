"""Ansible's INI inventory format, read as Ansible's ini plugin reads it.

    # comment (or ; comment)
    badwolf.example.com:5309            # before any section: group ungrouped
    [webservers]
    www[01:50:2].example.com ansible_user=deploy http_port=8080
    [dbservers:vars]
    ansible_port=2222
    [cluster:children]
    webservers

Host lines are split like a shell line (quotes group, `#` starts a comment); each token
after the host key is NAME=VALUE, and VALUE is a Python literal when it parses as one (22,
True, [1, 2]) and a string otherwise. In `[group:vars]` the value is the rest of the line.
A `[group:vars]` or `[group:children]` naming a group never defined is an error, as in
Ansible; a group listed under `:children` may be defined further down.
"""

from __future__ import annotations

import ast
import re
import shlex
import warnings
from pathlib import Path

from nodeprep.errors import InputError
from nodeprep.inventory.ansible import add_hosts
from nodeprep.inventory.sources import Schema, Source, check_var
from nodeprep.inventory.yamlfile import read_input, shown_path

_SECTION = re.compile(r"^\[([^:\]\s]+)(?::(\w+))?\]\s*(?:#.*)?$")
_GROUP_NAME = re.compile(r"^([^:\]\s]+)\s*(?:#.*)?$")
_HINT = "see Ansible's INI inventory format: [group], [group:vars], [group:children]"


def literal(text: str):
    """An INI value as Ansible takes it: a Python literal if it is one, else the text."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def read_text(path: Path) -> list[str]:
    """The file's lines; a control character (a NUL, an escape) is refused with its line."""
    lines = read_input(path).split("\n")
    for number, line in enumerate(lines, 1):
        bad = _CONTROL.search(line.rstrip("\r"))
        if bad:
            raise InputError(
                f"control character #x{ord(bad.group()):02x} in the file",
                "remove it (an inventory holds printable text only)",
                shown_path(path),
                number,
            )
    return [line.rstrip("\r") for line in lines]


def _section(
    src: Source, pending: dict, section: re.Match, file: str, number: int, where: str
) -> tuple[str, str]:
    """A section line: its group and its type (hosts, vars, children). The group is added
    where not known yet (a :vars section of an unknown group waits in PENDING instead), and
    the :children sections that named it before it was defined get it as their child."""
    group, state = section.group(1), section.group(2) or "hosts"
    if state not in ("hosts", "children", "vars"):
        raise InputError(
            f"section [{group}:{state}] has unknown type '{state}'",
            "the types are :vars and :children",
            file,
            number,
        )
    known = group in src.groups or group in src.outer_groups or group in ("all", "ungrouped")
    if not known and state == "vars":
        pending.setdefault(group, ("vars", number, []))
    elif not known:
        src.add_group(group, where)
    if state != "vars" and group in pending:
        for parent in pending.pop(group)[2]:
            src.add_child(parent, group, where)
    return group, state


def read_ini(src: Source, path: Path, schema: Schema) -> None:
    src.ansible, src.kind = True, "ansible-ini"
    file = shown_path(path)
    group, state = "ungrouped", "hosts"
    pending: dict[str, tuple[str, int, list[str]]] = {}  # group -> (state, line, parents)
    for number, raw in enumerate(read_text(path), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        where = f"{file}:{number}"
        section = _SECTION.match(line)
        if section:
            group, state = _section(src, pending, section, file, number, where)
            continue
        if line.startswith("[") and line.endswith("]"):
            raise InputError(
                f"invalid section '{line}'",
                "a section is [name], [name:vars] or [name:children], without spaces",
                file,
                number,
            )
        if state == "hosts":
            _host_line(src, group, line, schema, file, number)
        elif state == "vars":
            name, eq, value = line.partition("=")
            if not eq:
                raise InputError(
                    f"expected NAME=VALUE in [{group}:vars], got '{line}'", _HINT, file, number
                )
            checked = check_var(name.strip(), literal(value.strip()), schema, file, number, src=src)
            if checked:
                target = src.wide if group == "all" else src.group_vars.setdefault(group, {})
                target[checked[0]] = (checked[1], where)
        else:
            match = _GROUP_NAME.match(line)
            if not match:
                raise InputError(
                    f"expected a group name in [{group}:children], got '{line}'",
                    _HINT,
                    file,
                    number,
                )
            child = match.group(1)
            if child in src.groups or child in src.outer_groups or child in ("all", "ungrouped"):
                src.add_child(group, child, where)
            else:
                pending.setdefault(child, ("children", number, []))[2].append(group)
    _settle(src, pending, file)


def _settle(src: Source, pending: dict, file: str) -> None:
    """A group named by a :vars or :children section and never defined is an error, as
    Ansible makes it."""
    for child, (state, number, parents) in pending.items():
        if state == "vars":
            raise InputError(
                f"section [{child}:vars] is for a group that is never defined",
                f"define [{child}] or list it under a :children section",
                file,
                number,
            )
        raise InputError(
            f"section [{parents[-1]}:children] names group '{child}', which is never defined",
            f"add a [{child}] section",
            file,
            number,
        )


def _host_line(src: Source, group: str, line: str, schema: Schema, file: str, number: int):
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError as exc:
        raise InputError(
            f"cannot split the host line: {exc}", "check its quotes", file, number
        ) from None
    if not tokens:
        return
    key = tokens[0]
    if key.strip() == "---":
        raise InputError(
            "'---' starts a YAML document, not an INI host line",
            "give the file a .yml extension",
            file,
            number,
        )
    entry = {}
    for token in tokens[1:]:
        name, eq, value = token.partition("=")
        if not eq:
            raise InputError(
                f"expected NAME=VALUE after the host, got '{token}'", _HINT, file, number
            )
        checked = check_var(name, literal(value), schema, file, number, src=src)
        if checked:
            entry[checked[0]] = (checked[1], f"{file}:{number}")
    if key.endswith(":"):
        raise InputError(
            f"host '{key}' ends in ':'", "a ':' in a host key gives a port: host:2222", file, number
        )
    add_hosts(src, key, entry, group, (file, number))
