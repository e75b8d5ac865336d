"""The inventory: which nodes exist, how to reach them, and each node's variables.

`load(spec)` accepts:
  NAME             inventory/NAME/hosts.yml (or hosts.yaml) under the project root
  DIR, FILE.yml    a directory holding hosts.yml, or the YAML file itself
  hostfile:PATH    a DeepSpeed/MPI hostfile (`worker-1 slots=8` per line)
  slurm:[LIST]     a Slurm node list; without LIST, $SLURM_JOB_NODELIST
  pbs:[PATH]       a PBS nodefile (a name per slot); without PATH, $PBS_NODEFILE
A plain file that is not YAML is read as a hostfile if it says `slots=`, else as PBS.

The native YAML format:

    vars: {python: /usr/bin/python3}            # every host
    hosts:
      worker-[0-3]: {user: lab}                 # ranges allowed; the value may be null
      gpu01: {address: 10.0.0.5, port: 2222, slots: 8}
    groups:
      gpus: {hosts: [gpu01, "worker-[2-3]"], vars: {cpu_only: false}}

An Ansible YAML inventory loads as is: top-level groups (usually `all:`), each with
optional hosts: (name: vars or null; `node[01:04]` ranges too), children: (nested groups)
and vars:. ansible_host, ansible_port, ansible_user, ansible_ssh_private_key_file and
ansible_python_interpreter mean address, port, user, key and python; other ansible_*
variables are ignored. Beside the YAML file, group_vars/<group>.yml (or
group_vars/<group>/*.yml) and host_vars/<host>.yml are read too; `all` is every host.

Precedence, low to high: role defaults < inventory-wide vars (and group `all`) < group
vars (groups in order of appearance) < group_vars files (same order, `all` first) <
the host's entry < host_vars files < extra vars from the command line. explain() shows
the chain for one variable. Everything is validated against the schema before load()
returns; the first problem raises InputError naming file and line.
"""
from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from nodeprep.inventory import sources
from nodeprep.inventory import nodeset
from nodeprep.errors import InputError
from nodeprep.inventory.schema import VarSpec, load_schema
from nodeprep.settings import find_project
from nodeprep.inventory.yamlfile import LineDict, display, load_yaml

_NOT_FOUND_HINT = "create it, or use `invoke lab.up` for the local lab"


@dataclass
class Host:
    name: str
    address: str
    port: int
    user: str | None
    key: str | None                  # absolute path on the controller, or None
    groups: tuple[str, ...]
    vars: dict                       # merged; role defaults not included
    origin: dict[str, str]           # variable -> "file:line" or "cli"
    slots: int | None


@dataclass
class Inventory:
    name: str
    path: Path | None
    hosts: list[Host]
    groups: dict[str, list[str]]     # group -> host names; "all" included
    schema: dict[str, VarSpec] = field(default_factory=dict, repr=False)
    # host -> [(scope, {var: (value, origin)})], low to high precedence, for explain()
    layers: dict[str, list] = field(default_factory=dict, repr=False)

    def host(self, name: str) -> Host:
        for host in self.hosts:
            if host.name == name:
                return host
        raise InputError(f"no host '{name}' in inventory '{self.name}'",
                         sources.suggest(name, [h.name for h in self.hosts],
                                         "see the inventory's hosts"))

    def select(self, limit: str | None) -> list[Host]:
        """Hosts matching a comma list of node patterns, globs or groups; `!x` excludes."""
        if not limit or not limit.strip():
            return list(self.hosts)
        terms = nodeset.split_top(limit)
        wanted: set[str] = set()
        unwanted: set[str] = set()
        for term in terms:
            exclude = term.startswith("!")
            (unwanted if exclude else wanted).update(self._match(term.lstrip("!").strip()))
        if all(term.startswith("!") for term in terms):
            wanted = {h.name for h in self.hosts}
        chosen = [h for h in self.hosts if h.name in wanted and h.name not in unwanted]
        if not chosen:
            raise InputError(f"limit '{limit}' leaves no host", "check the exclusions")
        return chosen

    def _match(self, term: str) -> set[str]:
        names = [h.name for h in self.hosts]
        if term in self.groups:
            return set(self.groups[term])
        if any(char in term for char in "*?"):
            found = set(fnmatch.filter(names, term))
        else:
            try:
                found = set(nodeset.expand(term)) & set(names)
            except ValueError as exc:
                raise InputError(f"limit: {exc}", "ranges look like gpu[01-04,07]") from None
        if not found:
            raise InputError(f"limit '{term}' matches no host or group in inventory "
                             f"'{self.name}'", sources.suggest(
                                 term, [*names, *self.groups], "check the spelling"))
        return found

    def var(self, host: Host | str, name: str, schema: dict[str, VarSpec] | None = None):
        """The host's value, else the role default from the schema."""
        host = self.host(host) if isinstance(host, str) else host
        if name in host.vars:
            return host.vars[name]
        schema = schema if schema is not None else self.schema
        if name not in schema:
            raise KeyError(f"variable '{name}' is not in the schema: add it, documented, "
                           f"to the role's defaults.yml")
        return schema[name].default

    def explain(self, host_name: str, var: str) -> list[tuple[str, object, str]]:
        """(scope, value, origin) for every place that sets `var`, lowest precedence first;
        the last entry is the value in effect."""
        self.host(host_name)
        if var not in self.schema:
            raise InputError(f"unknown variable '{var}'",
                             sources.suggest(var, self.schema, "see the defaults files"))
        spec = self.schema[var]
        chain = [("default", spec.default, spec.source)]
        for scope, layer in self.layers[host_name]:
            if var in layer:
                chain.append((scope, *layer[var]))
        return chain


def load(spec: str | None, extra_vars: dict | None = None, default: str = "local",
         schema: dict[str, VarSpec] | None = None, root: Path | None = None) -> Inventory:
    """Read and validate an inventory (see the module docstring for `spec`).

    extra_vars are command-line values; give them already parsed as YAML scalars, so
    that `true` and `8` arrive as a bool and an int. `schema` defaults to the project's.
    ROOT: the project (inventory/NAME, roles/*/defaults.yml); default settings.find_project().
    """
    root = root or find_project()
    schema = schema if schema is not None else load_schema([root])
    src = _read(spec or default, schema, root)
    cli = {}
    for key, value in (extra_vars or {}).items():
        checked = sources.check_var(key, value, schema, None, None, "extra variable")
        if checked:
            cli[checked[0]] = (checked[1], "cli")
    return _build(src, cli, schema)


def _read(spec: str, schema, root: Path) -> sources.Source:
    kind, colon, arg = spec.partition(":")
    if colon and kind in ("hostfile", "pbs", "slurm"):
        if kind == "slurm":
            nodelist = arg or os.environ.get("SLURM_JOB_NODELIST", "")
            if not nodelist:
                raise InputError("slurm: needs $SLURM_JOB_NODELIST",
                                 "run inside a Slurm allocation, or give the list: "
                                 "slurm:gpu[01-04]")
            src = sources.Source(spec, None, Path.cwd())
            sources.read_slurm(src, nodelist)
            return src
        if kind == "pbs" and not arg:
            arg = os.environ.get("PBS_NODEFILE", "")
            if not arg:
                raise InputError("pbs: needs $PBS_NODEFILE",
                                 "run inside a PBS job, or give the file: pbs:PATH")
        return _read_plain(spec, Path(arg).expanduser(), kind, schema)
    path = Path(spec).expanduser()
    named = re.fullmatch(r"\w[\w.-]*", spec) and not spec.endswith((".yml", ".yaml"))
    if named and (root / "inventory" / spec).is_dir():
        path = root / "inventory" / spec
    if path.is_dir():
        for file in (path / "hosts.yml", path / "hosts.yaml"):
            if file.is_file():
                return _read_yaml(spec, file, schema)
        raise InputError(f"inventory '{spec}' not found: looked for "
                         f"{display(path / 'hosts.yml')}", _NOT_FOUND_HINT)
    if path.is_file():
        if path.suffix in (".yml", ".yaml"):
            return _read_yaml(spec, path, schema)
        return _read_plain(spec, path, None, schema)
    if named:
        raise InputError(f"inventory '{spec}' not found: looked for "
                         f"{display(root / 'inventory' / spec / 'hosts.yml')}", _NOT_FOUND_HINT)
    raise InputError(f"inventory '{spec}' not found", "give an inventory name, a directory, "
                     "a hosts.yml, or hostfile:PATH, slurm:, pbs:")


def _read_plain(spec: str, path: Path, kind: str | None, schema) -> sources.Source:
    if not path.is_file():
        raise InputError("file not found", "check the path",
                         display(path))
    if kind is None:
        text = path.read_text(encoding="utf-8", errors="replace")
        kind = "hostfile" if "slots=" in text else "pbs"
    src = sources.Source(spec, path, path.parent)
    if kind == "hostfile":
        sources.read_hostfile(src, path, schema)
    else:
        sources.read_pbs(src, path)
    return src


def _read_yaml(spec: str, path: Path, schema) -> sources.Source:
    data = load_yaml(path)
    src = sources.Source(spec, path, path.parent)
    file = display(path)
    if data is None:
        raise InputError("the inventory is empty", "add a hosts: section", file, 1)
    if not isinstance(data, LineDict):
        raise InputError("the top level must be a mapping", "start with `hosts:`, or "
                         "Ansible's `all:`", file, getattr(data, "line", 1))
    if any(key in data for key in sources.NATIVE_KEYS):
        sources.read_native(src, data, schema)
    else:
        sources.read_ansible(src, data, schema)
    if not src.hosts:
        raise InputError("the inventory has no hosts", "add hosts under `hosts:`", file,
                         data.line)
    sources.read_side_files(src, path.parent, schema)
    return src


def _build(src: sources.Source, cli: dict, schema) -> Inventory:
    hosts, layers = [], {}
    for name in src.hosts:
        member = [group for group, names in src.groups.items() if name in names]
        chain = [("inventory", src.wide)]
        chain += [(f"group {g}", src.group_vars.get(g, {})) for g in member]
        chain += [(f"group_vars {g}", src.group_files.get(g, {})) for g in ["all", *member]]
        chain += [("host", src.entry_vars.get(name, {})),
                  ("host_vars", src.host_files.get(name, {})), ("cli", cli)]
        layers[name] = [(scope, layer) for scope, layer in chain if layer]
        merged, origin = {}, {}
        for _, layer in layers[name]:
            for var, (value, where) in layer.items():
                merged[var], origin[var] = value, where
        key, user = merged.get("key"), merged.get("user")
        hosts.append(Host(
            name=name, address=str(merged.get("address") or name),
            port=merged.get("port", schema["port"].default),
            user=None if user is None else str(user),
            key=str(src.base / Path(key).expanduser()) if key else None,
            groups=tuple(member), vars=merged, origin=origin, slots=merged.get("slots")))
    groups = {**src.groups, "all": list(src.hosts)}
    return Inventory(src.name, src.path, hosts, groups, schema, layers)
