"""`invoke hosts.forget`: drop the pinned host keys of some nodes after a deliberate reinstall
(the next contact pins the new key, and says so)."""
from __future__ import annotations

from nodeprep.commands.options import ForgetOptions
from nodeprep.engine.hostkeys import PinnedHostKeys, host_entry
from nodeprep.inventory import load
from nodeprep.settings import Settings


def forget(opts: ForgetOptions, settings: Settings) -> list[tuple[str, int, str]]:
    """[(node, keys removed, known_hosts entry)]."""
    inv = load(opts.inventory, default=settings.default_inventory, root=settings.project)
    store = PinnedHostKeys(settings.known_hosts)
    out = []
    for h in inv.select(opts.nodes):
        entry = host_entry(h.address, h.port)
        out.append((h.name, store.forget(entry), entry))
    return out
