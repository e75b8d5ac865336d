"""`invoke inventory`: what nodeprep understood from an inventory, without contacting a node.

--list: every host with address, port, user, connection and groups; --graph: the group
tree; --host NAME: every variable of one host with the file:line it came from (secrets
masked). The result is data; cli.render turns it into text, or it is printed as JSON in the
shape documented in InventoryView.as_dict.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass

from nodeprep.commands.options import InventoryOptions
from nodeprep.errors import InputError
from nodeprep.inventory import connvars, load
from nodeprep.inventory.model import Host, Inventory
from nodeprep.redact import masked
from nodeprep.settings import Settings

# names that look secret but hold a path (the value is no secret)
_PATH_VARS = ("key", "controller_key", "ansible_ssh_private_key_file")


def shown(name: str, value):
    """VALUE as it may be shown: a secret's value is masked, at any depth."""
    return masked(name, value, _PATH_VARS)


@dataclass
class VarLine:
    name: str
    value: object
    origin: str  # file:line, cli, or "default FILE:LINE"
    _: KW_ONLY
    used: bool  # a nodeprep variable (False: kept from an Ansible inventory, unused)
    kind: str = ""  # an Ansible connection variable's class (used, ignored, refused: connvars)
    why: str = ""  # what it becomes, why it changes nothing, or what to write instead


@dataclass
class InventoryView:
    inventory: Inventory
    host: Host | None = None
    variables: tuple[VarLine, ...] = ()

    def as_dict(self) -> dict:
        """{inventory, format, hosts: {NAME: {address, port, user, connection, groups, vars}},
        groups: {GROUP: {hosts: [its own], children: [...]}} (all and ungrouped included),
        warnings}; with --host, {host, address, port, user, connection, groups, variables:
        {NAME: {value, origin, used}}}."""
        inv = self.inventory
        if self.host is not None:
            h = self.host
            return {
                "host": h.name,
                **_reach(h),
                "groups": list(h.groups),
                "variables": {
                    v.name: {
                        "value": v.value,
                        "origin": v.origin,
                        "used": v.used,
                        **({"class": v.kind, "why": v.why} if v.kind else {}),
                    }
                    for v in self.variables
                },
                "warnings": list(inv.warnings),
            }
        groups = {"all": {"hosts": [], "children": list(inv.children.get("all", []))}}
        for group, names in inv.direct.items():
            if group != "all":
                groups[group] = {
                    "hosts": list(names),
                    "children": list(inv.children.get(group, [])),
                }
        return {
            "inventory": inv.name,
            "format": inv.kind,
            "hosts": {
                h.name: {
                    **_reach(h),
                    "groups": list(h.groups),
                    "vars": {k: shown(k, v) for k, v in {**h.vars, **h.extra}.items()},
                }
                for h in inv.hosts
            },
            "groups": groups,
            "warnings": list(inv.warnings),
        }


def _reach(h: Host) -> dict:
    return {
        "address": h.address,
        "port": h.port,
        "user": h.user,
        "key": h.key,
        "connection": h.connection,
        "jump": ",".join(str(hop) for hop in h.jump) or None,
    }


def inventory(opts: InventoryOptions, settings: Settings) -> InventoryView:
    if sum(bool(x) for x in (opts.list, opts.graph, opts.host)) > 1:
        raise InputError("give one of --list, --graph, --host NAME")
    inv = load(opts.inventory, default=settings.default_inventory, root=settings.project)
    if not opts.host:
        return InventoryView(inv)
    host = inv.host(opts.host)
    lines = []
    for name, spec in sorted(inv.schema.items()):
        if name in host.vars:
            lines.append(VarLine(name, shown(name, host.vars[name]), host.origin[name], used=True))
        else:
            lines.append(
                VarLine(name, shown(name, spec.default), f"default {spec.source}", used=True)
            )
    for name, value in host.extra.items():
        rule = connvars.classify(name, value)
        lines.append(
            VarLine(
                name,
                shown(name, value),
                host.origin.get(name, ""),
                used=bool(rule and rule.status == "used"),
                kind=rule.status if rule else "",
                why=rule.text if rule else "",
            )
        )
    return InventoryView(inv, host, tuple(lines))
