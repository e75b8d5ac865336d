"""From an `--inventory` value to a Source: which reader reads what.

NAME             inventory/NAME/ under the project root (a directory, below)
DIR              every inventory file in it, as Ansible reads a directory: sorted by name,
                 hidden files, group_vars/, host_vars/ and backup/doc extensions skipped;
                 a later file's values win; group_vars/ and host_vars/ beside them
SCRIPT           an executable file with a shebang: Ansible's inventory script (--list, --host)
FILE.yml/.yaml/.json   JSON when it parses as JSON, else YAML, as Ansible's loader reads
                 a file (jsonfile.py): nodeprep's native format (top-level hosts:) or
                 Ansible's, or what an inventory script prints (dynamic.is_list_json: a
                 `_meta`, or in a .json file groups, hosts or children as lists)
FILE.ini         Ansible INI
FILE             any other file: a YAML mapping is YAML, else told apart by content
                 (hostfiles.sniff: Ansible INI, DeepSpeed/Open MPI hostfile, nodefile)
ini:PATH yaml:PATH hostfile:PATH pbs:[PATH] nodefile:PATH   force one reader
slurm:[LIST]     a Slurm node list; without LIST, $SLURM_JOB_NODELIST
sshconfig:[PATTERN]   the Host entries of ~/.ssh/config (matching PATTERN), read as ssh reads it
sshconfig:FILE   the Host entries of another ssh config file, as `ssh -F FILE` reads it
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from nodeprep.errors import InputError
from nodeprep.inventory import ansible, dynamic, hostfiles, ini, sources, sshconfig, sshconfig_files
from nodeprep.inventory.jsonfile import load_file
from nodeprep.inventory.yamlfile import LineDict, shown_path

_NOT_FOUND_HINT = "create it, or use `invoke lab.up` for the local lab"
_PREFIXES = ("hostfile", "pbs", "nodefile", "slurm", "ini", "yaml", "sshconfig")
# Ansible's INVENTORY_IGNORE_EXTS and the names it always skips in an inventory directory
_IGNORED_EXTS = (
    ".pyc",
    ".pyo",
    ".swp",
    ".bak",
    "~",
    ".rpm",
    ".md",
    ".txt",
    ".rst",
    ".orig",
    ".cfg",
    ".retry",
)
_IGNORED_NAMES = ("group_vars", "host_vars", "vars_plugins")
YAML_EXTS = (".yml", ".yaml", ".json")


def read(spec: str, schema, root: Path) -> sources.Source:
    kind, colon, arg = spec.partition(":")
    if colon and kind in _PREFIXES:
        return _prefixed(spec, kind, arg, schema)
    path = _expand(spec)
    named = re.fullmatch(r"\w[\w.-]*", spec) and not spec.endswith((*YAML_EXTS, ".ini"))
    if named and (root / "inventory" / spec).is_dir():
        path = root / "inventory" / spec
    if path.is_dir():
        return read_dir(spec, path, schema)
    if path.is_file():
        src = sources.Source(spec, path, path.parent)
        read_file(src, path, schema, alone=True)
        sources.read_side_files(src, path.parent, schema)
        return src
    if named:
        raise InputError(
            f"inventory '{spec}' not found: looked for {shown_path(root / 'inventory' / spec)}",
            _NOT_FOUND_HINT,
        )
    raise InputError(
        f"inventory '{spec}' not found",
        "give an inventory name, a directory, "
        "a file, or one of " + ", ".join(f"{p}:" for p in _PREFIXES),
    )


def _prefixed(spec: str, kind: str, arg: str, schema) -> sources.Source:
    if kind == "slurm":
        nodelist = arg or os.environ.get("SLURM_JOB_NODELIST", "")
        if not nodelist:
            raise InputError(
                "slurm: needs $SLURM_JOB_NODELIST",
                "run inside a Slurm allocation, or give the list: slurm:gpu[01-04]",
            )
        src = sources.Source(spec, None, Path.cwd())
        hostfiles.read_slurm(src, nodelist)
        return src
    if kind == "sshconfig":  # a path has a '/', a Host pattern never does
        path = _expand(arg) if "/" in arg else None
        src = sources.Source(
            spec, None, path.parent if path else sshconfig_files.passwd_home() / ".ssh"
        )
        sshconfig.read_sshconfig(src, None if path else (arg or None), schema, path)
        return src
    if kind == "pbs" and not arg:
        arg = os.environ.get("PBS_NODEFILE", "")
        if not arg:
            raise InputError(
                "pbs: needs $PBS_NODEFILE", "run inside a PBS job, or give the file: pbs:PATH"
            )
    path = _expand(arg)
    if not path.is_file():
        raise InputError("file not found", "check the path", shown_path(path))
    src = sources.Source(spec, path, path.parent)
    {
        "hostfile": lambda: hostfiles.read_hostfile(src, path, schema),
        "pbs": lambda: hostfiles.read_nodefile(src, path, schema),
        "nodefile": lambda: hostfiles.read_nodefile(src, path, schema),
        "ini": lambda: ini.read_ini(src, path, schema),
        "yaml": lambda: read_yaml(src, path, schema),
    }[kind]()
    if kind in ("ini", "yaml"):
        sources.read_side_files(src, path.parent, schema)
    return src


def _expand(text: str) -> Path:
    """TEXT as a path, `~` expanded; `~name` of a user this machine lacks stays as written
    (and is then not found)."""
    try:
        return Path(text).expanduser()
    except RuntimeError:
        return Path(text)


def read_dir(spec: str, path: Path, schema) -> sources.Source:
    """Every source under PATH in name order (subdirectories too), each seeing the groups
    and hosts the ones before it defined, as in Ansible; group_vars/ and host_vars/ of
    PATH itself only (Ansible does not read them in a subdirectory source)."""
    src = sources.Source(spec, path, path)
    kinds = _read_tree(src, path, schema)
    if not kinds:
        raise InputError(
            f"no inventory file in {shown_path(path)}",
            "add a hosts.yml or an Ansible inventory (INI or YAML)",
        )
    src.kind = kinds[0] if len(kinds) == 1 else "directory"
    sources.read_side_files(src, path, schema)
    return src


def _read_tree(into: sources.Source, path: Path, schema) -> list[str]:
    kinds = []
    for entry in sorted(path.iterdir()):
        name = entry.name
        if name.startswith(".") or name in _IGNORED_NAMES or name.endswith(_IGNORED_EXTS):
            continue
        if entry.is_dir():
            if entry.resolve() not in (path.resolve(), *path.resolve().parents):  # no loop
                kinds += _read_tree(into, entry, schema)
            continue
        if not entry.is_file():  # a FIFO, a socket, a dangling link: nothing to read
            continue
        part = sources.Source(
            into.name, entry, path, outer_groups=set(into.groups), outer_hosts=set(into.hosts)
        )
        read_file(part, entry, schema, alone=False)
        into.merge(part)
        kinds.append(part.kind)
    return kinds


def read_file(src: sources.Source, path: Path, schema, alone: bool) -> None:
    """One file by its extension, or (none or another) by content. ALONE: given by itself,
    so hostfiles and nodefiles are candidates; in a directory a file is YAML or INI, as
    for Ansible. An executable file with a shebang is an inventory script, as for Ansible."""
    if dynamic.is_script(path):
        return dynamic.read_script(src, path, schema)
    if path.suffix in YAML_EXTS:
        return read_yaml(src, path, schema)
    if path.suffix == ".ini":
        return ini.read_ini(src, path, schema)
    try:
        data = load_file(path)
    except InputError as exc:
        data, yaml_error = None, exc
    else:
        yaml_error = None
    if isinstance(data, LineDict):
        return read_yaml(src, path, schema, data)
    kind = hostfiles.sniff(path) if alone else "ini"
    if kind == "yaml":  # it looks like YAML: say what is wrong with it as YAML
        if yaml_error is not None:
            raise yaml_error
        return read_yaml(src, path, schema, data)
    {
        "ini": lambda: ini.read_ini(src, path, schema),
        "hostfile": lambda: hostfiles.read_hostfile(src, path, schema),
        "nodefile": lambda: hostfiles.read_nodefile(src, path, schema),
    }[kind]()


def read_yaml(src: sources.Source, path: Path, schema, data=None) -> None:
    data = load_file(path) if data is None else data
    file = shown_path(path)
    if data is None:
        raise InputError("the inventory is empty", "add a hosts: section", file, 1)
    if not isinstance(data, LineDict):
        raise InputError(
            "the top level must be a mapping",
            "start with `hosts:`, or Ansible's `all:`",
            file,
            getattr(data, "line", 1),
        )
    if dynamic.is_list_json(data, path):
        dynamic.read_list(src, data, schema, file)
    elif _native(data):
        sources.read_native(src, data, schema)
        if not src.hosts:
            raise InputError(
                "the inventory has no hosts", "add hosts under `hosts:`", file, data.line
            )
    else:
        ansible.read_ansible(src, data, schema)


def _native(data: LineDict) -> bool:
    """nodeprep's own format: a top-level hosts: that is not an Ansible group named hosts
    (whose keys would all be hosts:, children:, vars:)."""
    if "hosts" not in data:
        return False
    body = data["hosts"]
    group_like = isinstance(body, dict) and body and set(body) <= set(sources.GROUP_KEYS)
    return set(data) <= set(sources.NATIVE_KEYS) or not group_like
