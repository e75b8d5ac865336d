"""Ansible's dynamic inventories: an executable inventory script (Ansible's script plugin
contract: `SCRIPT --list` prints JSON, `_meta.hostvars` holds every host's variables, or
`SCRIPT --host NAME` gives them one host at a time) and the JSON that `ansible-inventory --list`
prints, which has the same shape (so any inventory plugin's hosts come in through
`ansible-inventory -i aws_ec2.yml --list > hosts.json`).

The shape: {GROUP: [host, ...] | {"hosts": [...], "vars": {...}, "children": [...]}, ...,
"_meta": {"hostvars": {host: {...}}}}. A host's _meta variables are its own (they beat its
groups'); hosts named only in _meta are not hosts (as for Ansible); `ungrouped` is the
hosts without a group."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from nodeprep.errors import InputError
from nodeprep.inventory.sources import Schema, Source, read_vars
from nodeprep.inventory.yamlfile import LineDict, LineList, load_text, shown_path

SCRIPT_TIMEOUT = 120       # seconds for one run of an inventory script (a cloud API call)


def is_script(path: Path) -> bool:
    """Ansible's test: an executable file whose first bytes are a shebang."""
    try:
        with open(path, "rb") as f:
            return f.read(2) == b"#!" and os.access(path, os.X_OK)
    except OSError:
        return False


def is_list_json(data) -> bool:
    """Is DATA (a parsed .json/.yml) what `ansible-inventory --list` prints? It always has
    `_meta` (an Ansible YAML inventory never does: a group named _meta would be odd, and a
    YAML group's hosts: as a list is an error Ansible reports, so nodeprep does too)."""
    return isinstance(data, LineDict) and isinstance(data.get("_meta"), LineDict)


def run_script(path: Path, args: list[str]) -> str:
    """SCRIPT ARGS' standard output, or an InputError naming the script and what it said."""
    shown = shown_path(path)
    try:
        r = subprocess.run([os.path.abspath(path), *args], capture_output=True, text=True, timeout=SCRIPT_TIMEOUT,
                           cwd=path.parent, stdin=subprocess.DEVNULL, errors="replace")
    except subprocess.TimeoutExpired:
        raise InputError(f"inventory script `{' '.join(args)}` did not finish in {SCRIPT_TIMEOUT} s",
                         "run it by hand to see where it waits", shown) from None
    except OSError as e:
        raise InputError(f"cannot run the inventory script: {e.strerror or e}",
                         "check its shebang line and that it is executable", shown) from None
    if r.returncode != 0:
        said = " ".join((r.stderr or r.stdout).split())[-300:]
        raise InputError(f"inventory script `{' '.join(args)}` exited {r.returncode}: {said or 'no output'}",
                         "run it by hand; fix it, or save its output: SCRIPT --list > hosts.json", shown)
    return r.stdout


def read_script(src: Source, path: Path, schema: Schema) -> None:
    src.ansible, src.kind = True, "ansible-script"
    shown = f"{shown_path(path)} --list"
    data = load_text(run_script(path, ["--list"]), shown)

    def host_vars(name: str):
        return load_text(run_script(path, ["--host", name]), f"{shown_path(path)} --host {name}")
    read_list(src, data, schema, shown, host_vars)
    src.kind = "ansible-script"


def read_list(src: Source, data, schema: Schema, file: str, host_vars=None) -> None:
    """The `--list` shape DATA into SRC. HOST_VARS(name): a host's variables when DATA has no
    `_meta.hostvars` (a script's `--host`); without it a host has none."""
    src.ansible, src.kind = True, "ansible-json"
    if not isinstance(data, LineDict):
        raise InputError("an inventory script's output must be a JSON object",
                         "print {\"group\": {\"hosts\": [...]}, \"_meta\": {\"hostvars\": {...}}}", file, 1)
    meta = data.get("_meta")
    hostvars = meta.get("hostvars") if isinstance(meta, LineDict) else None
    seen: list[str] = []
    for group, body in data.items():
        if group != "_meta":
            _group(src, str(group), body, schema, (file, data.line_of(group)), seen)
    for name in seen:
        if hostvars is not None:
            hv = hostvars.get(name)
        else:
            hv = host_vars(name) if host_vars else None
        if hv is not None:
            at = hostvars.line_of(name) if hostvars is not None else 1
            src.add_host(name, f"{file}:{at}", None, read_vars(hv, schema, file, at, src))


def _names(value, what: str, group: str, file: str, line: int) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, LineList) or not all(isinstance(v, (str, int)) for v in value):
        raise InputError(f"the {what} of group '{group}' must be a list of names",
                         f"write \"{what}\": [\"a\", \"b\"]", file, line)
    return [str(v) for v in value]


def _group(src: Source, group: str, body, schema: Schema, at: tuple[str, int], seen: list) -> None:
    file, line = at
    where = f"{file}:{line}"
    if isinstance(body, LineList):
        body = LineDict({"hosts": body})
        body.file, body.line = file, line
    if not isinstance(body, LineDict):
        src.warn(f"{where}: '{group}' is not a group (a list of hosts, or hosts/vars/children) "
                 "and is skipped")
        return
    if group not in ("all", "ungrouped"):
        src.add_group(group, where)
    if body.get("vars") is not None:
        layer = read_vars(body["vars"], schema, file, body.line_of("vars"), src)
        (src.wide if group == "all" else src.group_vars.setdefault(group, {})).update(layer)
    for kid in _names(body.get("children"), "children", group, file, body.line_of("children")):
        if kid != "ungrouped":
            src.add_child(group, kid, where)
    for name in _names(body.get("hosts"), "hosts", group, file, body.line_of("hosts")):
        src.add_host(name, where, None if group in ("all", "ungrouped") else group, {})
        if name not in seen:
            seen.append(name)
