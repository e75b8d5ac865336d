"""`invoke hosts.forget`: drop the pinned host keys of some nodes after a deliberate reinstall
(the next contact pins the new key, and says so). A jump host is named by its address, as the
error that refused its changed key says."""

from __future__ import annotations

from nodeprep.commands.options import ForgetOptions
from nodeprep.engine.hostkeys import PinnedHostKeys, host_entry
from nodeprep.inventory import load
from nodeprep.settings import Settings


def forget(opts: ForgetOptions, settings: Settings) -> list[tuple[str, int, str]]:
    """[(node or jump host, keys removed, known_hosts entry)]."""
    inv = load(opts.inventory, default=settings.default_inventory, root=settings.project)
    store = PinnedHostKeys(settings.known_hosts)
    hops = {hop.address: hop for h in inv.hosts for hop in h.jump}
    if opts.nodes in hops:  # a jump host: not a node of the inventory
        entry = host_entry(hops[opts.nodes].address, hops[opts.nodes].port)
        return [(f"jump host {opts.nodes}", store.forget(entry), entry)]
    out = []
    for h in inv.select(opts.nodes):
        entry = host_entry(h.address, h.port)
        out.append((h.name, store.forget(entry), entry))
    return out
