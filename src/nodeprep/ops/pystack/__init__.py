"""The Python stack on the nodes: a venv with the pinned requirements and the planned torch,
installed offline from wheels the controller downloads once per platform.

  paths.py       the venv's absolute path on a node, the PATH its ranks get, its verify stamp
  tags.py        which CPU a venv's wheels were built for (their platform tags)
  runcache.py    the per-run cache of what the stack roles compute once (in prov.shared):
                 platforms, pins, the torch plan, the wheelhouse manifests
  wheelhouse.py  the controller's wheelhouse: resolve and download once per node platform
  relay.py       wheels node to node in a chain over the mesh (the controller sends each once):
                 the chains and the sh each node runs
  relay_run.py   one pass's relay run: hop scripts in place, the chains fed at once
  wheelcast.py   the same by Slurm's sbcast (--via slurm)

`from nodeprep.ops import pystack` gives paths.py and runcache.py's names (pystack.venv_path, ...).
"""

from nodeprep.ops.pystack.paths import damaged, node_path, path_env, venv_path, verified_stamp
from nodeprep.ops.pystack.runcache import (
    fleet_majority,
    fleet_python,
    platform,
    requirement_pins,
    torch_plan,
    wheelhouse_manifests,
)
from nodeprep.ops.pystack.tags import foreign_packages

__all__ = [
    "damaged",
    "foreign_packages",
    "node_path",
    "verified_stamp",
    "path_env",
    "venv_path",
    "fleet_majority",
    "fleet_python",
    "platform",
    "requirement_pins",
    "torch_plan",
    "wheelhouse_manifests",
]
