"""What every command does first: load the inventory and select its nodes."""

from __future__ import annotations

import platform
from pathlib import Path

from nodeprep.errors import InputError
from nodeprep.inventory import connvars, load
from nodeprep.inventory.sources import split_origin
from nodeprep.ops.container import archive, registry
from nodeprep.ops.container import spec as container_spec
from nodeprep.settings import Settings


def select_hosts(
    spec: str | None, limit: str | None, settings: Settings, extra_vars=None, events=None
):
    """(inventory, selected hosts); InputError (with file:line) for a bad inventory, a
    missing key file or a host nodeprep cannot reach, before any node is touched. The
    inventory's warnings go to EVENTS."""
    inv = load(
        spec, extra_vars=extra_vars, default=settings.default_inventory, root=settings.project
    )
    for text in inv.warnings if events is not None else ():
        events.log(f"warning: {text}")
    hosts = inv.select(limit)
    for h in hosts:
        unsupported = reach_problem(h, alone=len(hosts) == 1)
        if unsupported:
            file, line = split_origin(h.origin.get(unsupported[0], ""))
            raise InputError(
                f"host {h.name}: {unsupported[1]}",
                hint=f"leave it out with --limit '!{h.name}', or reach it directly",
                file=file,
                line=line,
            )
        refused = refused_variable(h)
        if refused:
            file, line = split_origin(h.origin.get(refused[0], ""))
            raise InputError(
                f"host {h.name}: {refused[0]} is not honoured by nodeprep",
                hint=refused[1],
                file=file,
                line=line,
            )
        # A missing key file would otherwise surface per node as a confusing auth failure.
        if h.key and not Path(h.key).expanduser().is_file():
            file, line = split_origin(h.origin.get("key", ""))
            raise InputError(
                f"host {h.name}: key file {h.key} does not exist",
                hint="fix `key:` or create the key (ssh-keygen -t ed25519)",
                file=file,
                line=line,
            )
    return inv, hosts


def reach_problem(h, alone: bool) -> tuple[str, str] | None:
    """(variable, why) when nodeprep cannot reach host H the way its inventory says: a
    connection other than ssh or local, or a local node among others (they would have to reach
    it by an address the inventory does not give). Jump hosts are reached (engine/bastions.py);
    a jump form nodeprep cannot honour is refused when the inventory is read
    (inventory/jumps.py)."""
    if h.connection == "local" and not alone:
        return "connection", (
            "connection local (the controller itself) in a run with other "
            "nodes: they reach each other over ssh, and an address for it is "
            "missing; give it ansible_host=ADDRESS and ssh, or run it alone "
            f"with --limit {h.name}"
        )
    if h.connection not in ("ssh", "local"):
        return "connection", (
            f"connection '{h.connection}' is not supported: nodeprep reaches "
            "a node over ssh, or runs on the controller for local"
        )
    if getattr(h, "jump_problem", None):
        return h.jump_problem
    return None


def refused_variable(h) -> tuple[str, str] | None:
    """(variable, what to write instead) for the first of H's Ansible connection variables
    that nodeprep refuses (inventory/connvars.py: a password, an inline key, another ssh
    program, an ssh option that picks another target, ...)."""
    for var, value in h.extra.items():
        rule = connvars.classify(var, value)
        if rule is not None and rule.status == connvars.REFUSED:
            return var, rule.text
    return None


def parse_sets(items) -> dict:
    """--set KEY=VALUE (repeatable); values are YAML (`true`, `2`, `{a: 1}`)."""
    import yaml

    out = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise InputError(f"--set {item!r}: expected KEY=VALUE")
        try:
            out[key.strip()] = yaml.safe_load(raw) if raw.strip() else ""
        # PyYAML lets Python's own errors through for a value that does not fit its tag
        # (`!!int`, a date 2001-13-45, > 4300 digits) and for deep nesting
        except (
            yaml.YAMLError,
            ValueError,
            IndexError,
            KeyError,
            AttributeError,
            TypeError,
            RecursionError,
        ):
            raise InputError(f"--set {key}: value is not valid YAML: {raw!r}") from None
    return out


def container_specs(hosts, v_of: dict) -> dict:
    """node -> its ContainerSpec (None: the venv way); a bad value is one file:line error."""
    out = {}
    for h in hosts:
        try:
            out[h.name] = container_spec.from_vars(v_of[h.name])
        except container_spec.Refused as e:
            file, line = split_origin(h.origin.get(e.var, ""))
            raise InputError(f"{e.var}: {e}", file=file, line=line) from None
    return out


def container_images(hosts, v_of: dict, state: Path) -> dict:
    """node -> the image its container_image names, for the nodes on the container way: an
    ArchiveImage (read once per archive on the controller) or, for a registry reference, the
    Pinned that provision gave the node (STATE's record; a node never provisioned from here
    gets the reference pinned now for this controller's architecture)."""
    out, read, pins = {}, {}, {}
    for h in hosts:
        spec = container_specs([h], v_of)[h.name]
        if spec is None:
            continue
        where = split_origin(h.origin.get("container_image", ""))
        if spec.image.archive:
            out[h.name] = archive.named(spec.image, *where, read)
            continue
        ref = spec.image.qualified
        out[h.name] = registry.recall(state, ref, h.name)
        if out[h.name] is None:
            if ref not in pins:
                try:
                    pins[ref] = registry.resolve(ref, registry.arch_of(platform.machine()))
                except registry.RegistryError as e:
                    raise InputError(
                        f"container_image {e}", hint=e.hint, file=where[0], line=where[1]
                    ) from None
            out[h.name] = pins[ref]
    return out
