"""Ansible's dynamic inventories: an executable inventory script (Ansible's script plugin
contract: `SCRIPT --list` prints JSON, `_meta.hostvars` holds every host's variables, or
`SCRIPT --host NAME` gives them one host at a time), and a `.json` file holding what such a
script prints (`SCRIPT --list > hosts.json`, or the JSON `ansible-inventory --list` prints,
which has the same shape: so any inventory plugin's hosts come in through
`ansible-inventory -i aws_ec2.yml --list > hosts.json`).

The output of a script is JSON and parsed as JSON (jsonfile.load_json: tabs and all), never
as YAML. Its shape, read as ansible-core 2.19's script plugin reads it:

  {GROUP: [host, ...] | {"hosts": [...], "vars": {...}, "children": [...]}, ...,
   "_meta": {"hostvars": {host: {...}}}}

A group's hosts must be a list of names (a name is taken as written: no ranges, no
`:port`), its vars a mapping, its children a list (a mapping: its keys; a string: each
character, as Ansible iterates it); a group that is a mapping with none of hosts, vars and
children is one host of that name in a group of that name, the mapping its group's
variables (Ansible's deprecated "malformed group"). A host's `_meta` variables are its own
(they beat its groups'). A host that `_meta.hostvars` names and no group lists is no host, as
for Ansible: a warning names such hosts, and another says so when no host is left. `_meta`
without `hostvars` is refused, as Ansible refuses it. Without `_meta` a script is asked
`--host NAME` for each host; a `.json` file cannot be, so its hosts have no variables (as a
script answering `{}`). `ungrouped` holds the hosts without a group; `all`'s vars are every
host's.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from nodeprep.errors import InputError
from nodeprep.inventory.jsonfile import load_json
from nodeprep.inventory.sources import GROUP_KEYS, Schema, Source, read_vars
from nodeprep.inventory.yamlfile import LineDict, LineList, shown_path

SCRIPT_TIMEOUT = 120  # seconds for one run of an inventory script (a cloud API call)
_SHAPE = 'print {"group": {"hosts": ["h1"], "vars": {...}}, "_meta": {"hostvars": {"h1": {...}}}}'


def is_script(path: Path) -> bool:
    """Ansible's test: an executable file whose first bytes are a shebang."""
    try:
        with open(path, "rb") as f:
            return f.read(2) == b"#!" and os.access(path, os.X_OK)
    except OSError:
        return False


def is_list_json(data, path: Path) -> bool:
    """Is DATA (a parsed file) what an inventory script prints rather than an Ansible YAML
    inventory? Any file: when it has a `_meta` mapping (`ansible-inventory --list` always
    prints one; an Ansible YAML inventory has no such group). A `.json` file also when it
    has `_meta` at all, a group given as a list, or a group whose hosts or children are a
    list (a YAML inventory's are mappings: Ansible's yaml plugin refuses lists)."""
    if not isinstance(data, LineDict):
        return False
    if isinstance(data.get("_meta"), LineDict):
        return True
    if Path(path).suffix != ".json":
        return False
    return "_meta" in data or any(
        isinstance(body, LineList)
        or isinstance(body, LineDict)
        and any(isinstance(body.get(key), LineList) for key in ("hosts", "children"))
        for body in data.values()
    )


def run_script(path: Path, args: list[str]) -> str:
    """SCRIPT ARGS' standard output, or an InputError naming the script and what it said."""
    shown = shown_path(path)
    try:
        r = subprocess.run(
            [os.path.abspath(path), *args],
            capture_output=True,
            text=True,
            timeout=SCRIPT_TIMEOUT,
            cwd=path.parent,
            stdin=subprocess.DEVNULL,
            errors="replace",
        )
    except subprocess.TimeoutExpired:
        raise InputError(
            f"inventory script `{' '.join(args)}` did not finish in {SCRIPT_TIMEOUT} s",
            "run it by hand to see where it waits",
            shown,
        ) from None
    except OSError as e:
        raise InputError(
            f"cannot run the inventory script: {e.strerror or e}",
            "check its shebang line and that it is executable",
            shown,
        ) from None
    if r.returncode != 0:
        said = " ".join((r.stderr or r.stdout).split())[-300:]
        raise InputError(
            f"inventory script `{' '.join(args)}` exited {r.returncode}: {said or 'no output'}",
            "run it by hand; fix it, or save its output: SCRIPT --list > hosts.json",
            shown,
        )
    return r.stdout


def read_script(src: Source, path: Path, schema: Schema) -> None:
    shown = f"{shown_path(path)} --list"
    data = load_json(run_script(path, ["--list"]), shown)

    def host_vars(name: str):
        said = run_script(path, ["--host", name])  # nothing at all means no variables
        return load_json(said, f"{shown_path(path)} --host {name}") if said.strip() else LineDict()

    read_list(src, data, schema, shown, host_vars)
    src.kind = "ansible-script"


def read_list(src: Source, data, schema: Schema, file: str, host_vars=None) -> None:
    """The `--list` shape DATA into SRC. HOST_VARS(name): a host's variables when DATA has no
    `_meta` (a script's `--host`); without it a host has none."""
    src.ansible, src.kind = True, "ansible-json"
    if not isinstance(data, LineDict):
        raise InputError(
            f"an inventory script's output must be a JSON object, not {_kind(data)}",
            _SHAPE,
            file,
            getattr(data, "line", 1),
        )
    hostvars = _hostvars(data, file)
    listed: dict[str, None] = {}  # every host a group lists, in order
    for group, body in data.items():
        if group != "_meta":
            _group(src, group, body, schema, (file, data.line_of(group)), listed)
    for name in listed:
        if hostvars is not None:
            hv, at = hostvars.get(name, LineDict()), hostvars.line_of(name)
        else:
            hv, at = (host_vars(name) if host_vars else LineDict()), 1
        if not isinstance(hv, LineDict):
            raise InputError(
                f"the variables of host '{name}' must be a mapping, not {_kind(hv)}",
                'write "HOST": {"var": "value"}',
                getattr(hv, "file", file),
                at,
            )
        src.add_host(name, f"{file}:{at}", None, read_vars(hv, schema, file, at, src))
    if hostvars is None and host_vars is None and listed:
        src.warn(
            f"{file}: no _meta.hostvars, and a file cannot be asked `--host NAME`: its hosts "
            "have their groups' variables only (save the script's output with _meta, or "
            "give nodeprep the script itself)"
        )
    _say_unlisted(src, hostvars, listed, file)


def _hostvars(data: LineDict, file: str) -> LineDict | None:
    """`_meta.hostvars`, or None without `_meta`; a `_meta` Ansible refuses is refused."""
    if "_meta" not in data:
        return None
    meta, at = data["_meta"], data.line_of("_meta")
    if not isinstance(meta, LineDict):
        raise InputError(f"'_meta' must be a mapping, not {_kind(meta)}", _SHAPE, file, at)
    profile = meta.get("profile", "inventory_legacy")
    if profile != "inventory_legacy":
        raise InputError(
            f"'_meta' names the profile {profile!r}, which Ansible does not read",
            'remove it, or write "profile": "inventory_legacy"',
            file,
            meta.line_of("profile"),
        )
    hostvars = meta.get("hostvars")
    if not isinstance(hostvars, LineDict):
        has = _kind(hostvars) if "hostvars" in meta else "none"
        raise InputError(
            f"'_meta' needs 'hostvars', a mapping of host: variables (it has {has})",
            'write "_meta": {"hostvars": {}} when no host has variables, as Ansible requires',
            file,
            meta.line_of("hostvars") if "hostvars" in meta else at,
        )
    return hostvars


def _say_unlisted(src: Source, hostvars: LineDict | None, listed: dict, file: str) -> None:
    """Warn of the hosts `_meta.hostvars` names and no group lists, and of no host at all."""
    unlisted = [name for name in hostvars or () if name not in listed]
    if unlisted:
        names = ", ".join(map(str, unlisted[:3])) + (
            f" and {len(unlisted) - 3} more" if len(unlisted) > 3 else ""
        )
        src.warn(
            f"{file}:{hostvars.line_of(unlisted[0])}: _meta.hostvars names {len(unlisted)} "
            f"host(s) that no group lists ({names}): they are not hosts, as for Ansible; "
            'list each under a group, or under "ungrouped"'
        )
    if not listed:
        src.warn(
            f"{file}: no group lists a host, so the inventory has no hosts "
            '(list them: "ungrouped": {"hosts": ["h1"]})'
        )


def _kind(value) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", str: "a string", int: "a number", float: "a number"}.get(
        type(value),
        "a list"
        if isinstance(value, list)
        else "a mapping"
        if isinstance(value, dict)
        else "a value",
    )


def _body(src: Source, group: str, body, at: tuple[str, int]) -> LineDict:
    """A group's value as a mapping of hosts/vars/children, as the script plugin takes it."""
    file, line = at
    if isinstance(body, LineList):
        shaped = LineDict({"hosts": body})
    elif not isinstance(body, LineDict):
        raise InputError(
            f"group '{group}' must be a list of hosts or a mapping of hosts, vars "
            f"and children, not {_kind(body)}",
            f'write "{group}": ["host1"] or "{group}": {{"hosts": ["host1"]}}',
            file,
            line,
        )
    elif not any(key in body for key in GROUP_KEYS):
        src.warn(
            f"{file}:{line}: '{group}' has no hosts, vars or children: read as Ansible reads "
            f"it, as one host '{group}' in a group of its own, with these as the group's "
            "variables"
        )
        hosts = LineList([group])
        hosts.file = file
        hosts.line = line
        hosts.lines = [line]
        shaped = LineDict({"hosts": hosts, "vars": body})
    else:
        return body
    shaped.file, shaped.line = file, line
    return shaped


def _group(src: Source, group, body, schema: Schema, at: tuple[str, int], listed: dict) -> None:
    file, line = at
    where = f"{file}:{line}"
    group = str(group)
    body = _body(src, group, body, at)
    if group not in ("all", "ungrouped"):
        src.add_group(group, where)
    if "hosts" in body:
        hosts = body["hosts"]
        if not isinstance(hosts, LineList):
            raise InputError(
                f"the hosts of group '{group}' must be a list of names, not {_kind(hosts)}",
                'write "hosts": ["host1", "host2"]',
                file,
                body.line_of("hosts"),
            )
        for index, name in enumerate(hosts):
            if not isinstance(name, str) or not name:
                raise InputError(
                    f"group '{group}' lists {_kind(name) if name != '' else 'an empty name'} "
                    "as a host",
                    'a host is a name in quotes: "host1"',
                    file,
                    hosts.line_of(index),
                )
            src.add_host(
                name,
                f"{file}:{hosts.line_of(index)}",
                None if group in ("all", "ungrouped") else group,
                {},
            )
            listed[name] = None
    if "vars" in body:
        if not isinstance(body["vars"], LineDict):
            raise InputError(
                f"the vars of group '{group}' must be a mapping, not {_kind(body['vars'])}",
                'write "vars": {"name": "value"}',
                file,
                body.line_of("vars"),
            )
        layer = read_vars(body["vars"], schema, file, body.line_of("vars"), src)
        (src.wide if group == "all" else src.group_vars.setdefault(group, {})).update(layer)
    if "children" in body:
        _children(src, group, body["children"], (file, body.line_of("children")))


def _children(src: Source, group: str, kids, at: tuple[str, int]) -> None:
    file, line = at
    if isinstance(kids, str):
        src.warn(
            f"{file}:{line}: the children of group '{group}' are a string: each character "
            "is a group, as Ansible iterates it (write a list)"
        )
        kids = list(kids)
    if not isinstance(kids, (list, dict)):
        raise InputError(
            f"the children of group '{group}' must be a list of group names, not {_kind(kids)}",
            'write "children": ["group1"]',
            file,
            line,
        )
    for kid in kids:
        if not isinstance(kid, str) or not kid:
            raise InputError(
                f"group '{group}' lists {_kind(kid) if kid != '' else 'an empty name'} as a child",
                'a group is a name in quotes: "group1"',
                file,
                line,
            )
        if kid in (group, "all"):
            raise InputError(
                f"group '{group}' lists '{kid}' as its child: a loop, which Ansible refuses",
                "remove it from the children",
                file,
                line,
            )
        if kid != "ungrouped":
            src.add_child(group, kid, f"{file}:{line}")
