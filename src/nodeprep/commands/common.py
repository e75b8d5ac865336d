"""What every command does first: load the inventory and select its nodes."""
from __future__ import annotations

from pathlib import Path

from nodeprep.errors import InputError
from nodeprep.inventory import load
from nodeprep.settings import Settings


def select_hosts(spec: str | None, limit: str | None, settings: Settings, extra_vars=None):
    """(inventory, selected hosts); InputError (with file:line) for a bad inventory or a
    missing key file, before any node is touched."""
    inv = load(spec, extra_vars=extra_vars, default=settings.default_inventory,
               root=settings.project)
    hosts = inv.select(limit)
    for h in hosts:
        # A missing key file would otherwise surface per node as a confusing auth failure.
        if h.key and not Path(h.key).expanduser().is_file():
            where = h.origin.get("key", "")
            file, _, line = where.rpartition(":")
            raise InputError(f"host {h.name}: key file {h.key} does not exist",
                             hint="fix `key:` or create the key (ssh-keygen -t ed25519)",
                             file=file or None, line=int(line) if line.isdigit() else None)
    return inv, hosts


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
        except yaml.YAMLError:
            raise InputError(f"--set {key}: value is not valid YAML: {raw!r}") from None
    return out
