"""The inventory: which nodes exist, how to reach them, and each node's variables.

`load(spec)` reads the inventory (inventory.reader says which forms and how they are told
apart) and validates every variable against the schema; the first problem raises
InputError naming file and line.

The native YAML format:

    vars: {python: /usr/bin/python3}            # every host
    hosts:
      worker-[0-3]: {user: lab}                 # ranges allowed; the value may be null
      gpu01: {address: 10.0.0.5, port: 2222, slots: 8}
    groups:
      gpus: {hosts: [gpu01, "worker-[2-3]"], vars: {cpu_only: false}}

Ansible inventories (YAML or INI, a file or a directory of them) load with Ansible's
semantics: host keys as Ansible parses them (inventory.addresses), ansible_host,
ansible_port, ansible_user, ansible_ssh_private_key_file, ansible_python_interpreter and
ansible_connection mean address, port, user, key, python and connection; every other
variable is kept (Host.extra), shown by `invoke inventory --host`, and not used; one that
looks like a misspelt nodeprep variable gets a warning. group_vars/ and host_vars/ beside
the inventory are read as Ansible reads them.

Precedence, low to high: role defaults < inventory-wide vars (and group `all`) < group
vars < group_vars files (`all` first) < the host's entry < host_vars files < extra vars
from the command line. Groups are ordered as written in a native inventory and as Ansible
orders them in an Ansible one (parents before children, then ansible_group_priority, then
name). explain() shows the chain for one variable.
"""

from __future__ import annotations

import fnmatch
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path

from nodeprep.errors import InputError
from nodeprep.inventory import ansible, connvars, dsfilter, fields, jumps, nodeset, reader, sources
from nodeprep.inventory.schema import VarSpec, load_schema
from nodeprep.settings import find_project


@dataclass
class Host:
    name: str
    address: str
    port: int
    _: KW_ONLY
    user: str | None
    key: str | None  # absolute path on the controller, or None
    groups: tuple[str, ...]
    vars: dict  # merged; role defaults not included
    origin: dict[str, str]  # variable -> "file:line" or "cli"
    slots: int | None
    connection: str = "ssh"  # ssh, local, or what an Ansible inventory said
    extra: dict = field(default_factory=dict)  # variables nodeprep does not use (Ansible's)
    jump: tuple = ()  # jumps.Hop chain in front of the node (a bastion)
    jump_problem: tuple | None = None  # (variable, why): a jump form nodeprep cannot honour


@dataclass
class Inventory:
    name: str
    path: Path | None
    hosts: list[Host]
    _: KW_ONLY
    groups: dict[str, list[str]]  # group -> host names; "all" included
    schema: dict[str, VarSpec] = field(default_factory=dict, repr=False)
    # host -> [(scope, {var: (value, origin)})], low to high precedence, for explain()
    layers: dict[str, list] = field(default_factory=dict, repr=False)
    children: dict[str, list[str]] = field(default_factory=dict)  # group -> child groups
    direct: dict[str, list[str]] = field(default_factory=dict)  # group -> its own hosts
    warnings: list[str] = field(default_factory=list)
    kind: str = "native"  # the format read: native, ansible-ini, hostfile, ...

    def host(self, name: str) -> Host:
        for host in self.hosts:
            if host.name == name:
                return host
        raise InputError(
            f"no host '{name}' in inventory '{self.name}'",
            sources.suggest(name, [h.name for h in self.hosts], "see the inventory's hosts"),
        )

    def select(self, limit: str | None) -> list[Host]:
        """Hosts matching a comma list of node patterns, globs or groups; `!x` excludes. A
        limit with `@` or `:` is DeepSpeed's --include/--exclude form (dsfilter.py): its
        nodes here, its slots where a launch knows them."""
        if not self.hosts:
            raise InputError(
                f"inventory '{self.name}' has no hosts",
                "`invoke inventory --graph` shows what was read",
            )
        if not limit or not limit.strip():
            return list(self.hosts)
        if dsfilter.is_filter(limit):
            return self._select_filter(limit)
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

    def _select_filter(self, limit: str) -> list[Host]:
        f = dsfilter.parse(limit)
        names = [h.name for h in self.hosts]
        for name in f.nodes:
            if name not in names:
                raise InputError(
                    f"limit {limit!r}: node {name!r} is not in inventory '{self.name}'",
                    sources.suggest(name, names, dsfilter.HINT),
                )
        keep = set(f.pick(names))
        chosen = [h for h in self.hosts if h.name in keep]
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
            raise InputError(
                f"limit '{term}' matches no host or group in inventory '{self.name}'",
                sources.suggest(term, [*names, *self.groups], "check the spelling"),
            )
        return found

    def var(self, host: Host | str, name: str, schema: dict[str, VarSpec] | None = None):
        """The host's value, else the role default from the schema."""
        host = self.host(host) if isinstance(host, str) else host
        if name in host.vars:
            return host.vars[name]
        schema = schema if schema is not None else self.schema
        if name not in schema:
            raise KeyError(
                f"variable '{name}' is not in the schema: add it, documented, "
                f"to the role's defaults.yml"
            )
        return schema[name].default

    def explain(self, host_name: str, var: str) -> list[tuple[str, object, str]]:
        """(scope, value, origin) for every place that sets `var`, lowest precedence first;
        the last entry is the value in effect."""
        self.host(host_name)
        if var not in self.schema:
            raise InputError(
                f"unknown variable '{var}'",
                sources.suggest(var, self.schema, "see the defaults files"),
            )
        spec = self.schema[var]
        chain = [("default", spec.default, spec.source)]
        for scope, layer in self.layers[host_name]:
            if var in layer:
                chain.append((scope, *layer[var]))
        return chain


def load(
    spec: str | None,
    extra_vars: dict | None = None,
    default: str = "local",
    schema: dict[str, VarSpec] | None = None,
    root: Path | None = None,
    check_fields: bool = True,
) -> Inventory:
    """Read and validate an inventory (see the module docstring for `spec`).

    extra_vars are command-line values; give them already parsed as YAML scalars, so
    that `true` and `8` arrive as a bool and an int. `schema` defaults to the project's.
    ROOT: the project (inventory/NAME, roles/*/defaults.yml); default settings.find_project().
    CHECK_FIELDS: refuse unsafe names, addresses, users and values (inventory.fields); only a
    test comparing the parse with Ansible's turns it off.
    """
    root = root or find_project()
    schema = schema if schema is not None else load_schema([root])
    src = reader.read(spec or default, schema, root)
    cli = {}
    for key, value in (extra_vars or {}).items():
        checked = sources.check_var(key, value, schema, None, None)
        if checked:
            cli[checked[0]] = (checked[1], "cli")
    return _build(src, cli, schema, check_fields)


def _build(src: sources.Source, cli: dict, schema, check_fields: bool = True) -> Inventory:
    direct = {g: list(names) for g, names in src.groups.items()}
    members = {g: _members(src, g, set()) for g in src.groups}
    grouped = {n for g, names in members.items() if g != "ungrouped" for n in names}
    ungrouped = [n for n in src.hosts if n not in grouped]
    if src.ansible:
        order = ansible.group_order(src)
        direct["ungrouped"] = ungrouped
        members["ungrouped"] = ungrouped
    hosts, layers = [], {}
    for name in src.hosts:
        member = [g for g in members if name in members[g] and g != "ungrouped"]
        if src.ansible:
            member = sorted(
                member + (["ungrouped"] if name in ungrouped else []), key=lambda g: order[g]
            )
        chain = [("inventory", src.wide)]
        chain += [(f"group {g}", src.group_vars.get(g, {})) for g in member]
        chain += [(f"group_vars {g}", src.group_files.get(g, {})) for g in ["all", *member]]
        entry = src.entry_vars.get(name, {})
        if name in src.key_ports:  # `host:PORT`: under the entry's own port
            entry = {"port": src.key_ports[name], **entry}
        chain += [("host", entry), ("host_vars", src.host_files.get(name, {})), ("cli", cli)]
        layers[name] = [(scope, layer) for scope, layer in chain if layer]
        hosts.append(_host(name, layers[name], member, src, schema))
        if check_fields:
            fields.check_host(hosts[-1], src.hosts[name])
    groups = {**members, "all": list(src.hosts)}
    children = {g: list(src.children.get(g, [])) for g in groups}
    tops = [g for g in groups if g != "all" and not any(g in k for k in src.children.values())]
    children["all"] = [
        g
        for g in [*src.children.get("all", []), *tops]
        if g != "all" and (g != "ungrouped" or ungrouped or "ungrouped" in src.groups)
    ]
    children["all"] = list(dict.fromkeys(children["all"]))
    return Inventory(
        src.name,
        src.path,
        hosts,
        groups=groups,
        schema=schema,
        layers=layers,
        children=children,
        direct=direct,
        warnings=list(src.warnings),
        kind=src.kind,
    )


def _host(name: str, layers: list, member: list[str], src: sources.Source, schema) -> Host:
    merged, origin = {}, {}
    for _, layer in layers:
        for var, (value, where) in layer.items():
            merged[var], origin[var] = value, where
    for strong, target in connvars.STRONG.items():  # Ansible: this spelling wins at any level
        if strong in merged:
            merged[target], origin[target] = merged.pop(strong), origin[strong]
    known = {k: v for k, v in merged.items() if k in schema}
    extra = {k: v for k, v in merged.items() if k not in schema}
    key, user = known.get("key"), known.get("user")
    try:
        key = str((src.base / Path(key).expanduser()).absolute()) if key else None
    except RuntimeError:  # ~someone/ for a user this machine does not know
        raise InputError(
            f"host {name}: key {str(key)[:60]!r}: no such user's home directory",
            "give the key file's full path",
            *fields.split_where(origin.get("key", "")),
        ) from None
    try:
        jump, jump_problem = jumps.of_host(name, known, extra, origin), None
    except jumps.Unsupported as e:  # refused when a command selects the host
        jump, jump_problem = (), (e.variable, e.why)
    return Host(
        name=name,
        address=str(known.get("address") or name),
        port=known.get("port", schema["port"].default),
        user=None if user is None else str(user),
        key=key,
        groups=tuple(g for g in member if g != "ungrouped"),
        vars=known,
        origin=origin,
        slots=known.get("slots"),
        connection=str(known.get("connection") or "ssh"),
        extra=extra,
        jump=jump,
        jump_problem=jump_problem,
    )


def _members(src: sources.Source, group: str, seen: set) -> list[str]:
    """A group's hosts, its children's included; SEEN stops a group containing itself."""
    seen.add(group)
    names = list(src.groups.get(group, []))
    for child in src.children.get(group, []):
        if child not in seen:
            names.extend(n for n in _members(src, child, seen) if n not in names)
    return names
