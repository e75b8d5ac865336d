"""The inventory layer, pure data (no ssh): readers for every format users already have
(sources.py), the variable schema (schema.py), node sets such as worker-[0-7] (nodeset.py), and
the validated Inventory with its hosts and variable precedence (model.py)."""
from nodeprep.inventory.model import Host, Inventory, load

__all__ = ["Host", "Inventory", "load"]
