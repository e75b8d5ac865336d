"""Roles are folders under roles/: role.py (its steps), defaults.yml (its variables, each
documented), templates/. roles/site.yml lists the order `provision` applies them in.

A role module may define:
  FACTS = [...]               plain facts it reads (objects from nodeprep.engine.facts: USER, OS)
  reads(ctx) -> [...]         parametrized fact requests, from vars only, e.g. FILE(path)
  validate(prov)              raise InputError for bad inventory values, before any node is touched
  controller(prov) -> [StepResult]  work on the controller (keys, its ~/.ssh/config), once
  steps(ctx) -> [Step]        the node's desired state, after the probe (ctx.facts, prov.facts)
  report(ctx) -> dict         extra per-node data for the run report (e.g. pip freeze)
The engine imports roles; roles import the engine, never the other way round.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from nodeprep.engine.events import Events
from nodeprep.errors import InputError
from nodeprep.inventory.sources import split_origin
from nodeprep.inventory.yamlfile import load_yaml
from nodeprep.ops.provision.topology import Topology

UNSET = object()  # a Shared value not computed yet (None is a value: "no torch")


@dataclass
class Shared:
    """Controller-side values one role (or ops module) computes once per run and others read.
    Each field says who writes it."""

    controller_key: Path | None = None  # ssh_keys.controller(): the controller's key pair
    cluster_key: Path | None = None  # ssh_keys.controller(): the key nodes log in with
    pins: list | None = None  # pystack.requirement_pins(): python_requirements
    torch_plan: object = UNSET  # pystack.torch_plan(): a torchplan.Plan, or None
    manifests: dict | None = None  # pystack.wheelhouse_manifests(): node -> (dir, manifest)
    wheelhouse_errors: dict = field(default_factory=dict)  # node -> why its wheels failed
    socket_ifname: object = UNSET  # ncclenv.run_proposal(): node -> NCCL_SOCKET_IFNAME or None
    known_hosts: list | None = None  # ssh_keys.known_hosts_lines(): the mesh block, once per run
    majorities: dict = field(
        default_factory=dict
    )  # pystack.fleet_majority(): name -> the fleet's value
    relay: object = None  # wheelhouse.controller(): an ops.relay.Relay (the wheel fan-out)
    ssh_entries: dict = field(
        default_factory=dict
    )  # ssh_config.steps(): identity -> the nodes' Host block
    via: str = "ssh"  # commands.provision: the transport (ssh | slurm)
    key_texts: dict = field(default_factory=dict)  # ssh_keys: path -> its text, read once per run
    images: dict = field(default_factory=dict)  # container.controller(): node -> its ArchiveImage
    image_relay: object = None  # container.controller(): an ops.relay.Relay for the archives
    image_sums: dict = field(default_factory=dict)  # container.controller(): path -> sha256


@dataclass
class Provisioning:
    """What one provision run knows about the whole fleet; shared by every role."""

    inventory: object
    hosts: list
    settings: object
    check_mode: bool = False  # --check: change nothing, say what would change
    vars: dict = field(default_factory=dict)  # node -> resolved variables
    facts: dict = field(default_factory=dict)  # node -> facts from the probe
    shared: Shared = field(default_factory=Shared)
    notes: list = field(default_factory=list)  # things to tell the user once
    events: Events = field(default_factory=Events)  # controller-side progress goes here
    topology: Topology = field(default_factory=Topology)  # who shares a home or a machine

    def origin(self, node: str, var: str) -> tuple[str | None, int | None]:
        """(file, line) where VAR was set for NODE, for one-line input errors."""
        return split_origin(self.inventory.host(node).origin.get(var, ""))


@dataclass
class Ctx:
    """One node as a role sees it."""

    host: object
    prov: Provisioning

    @property
    def name(self) -> str:
        return self.host.name

    @property
    def vars(self) -> dict:
        return self.prov.vars[self.host.name]

    @property
    def facts(self) -> dict:
        return self.prov.facts.get(self.host.name, {})


@dataclass
class Role:
    name: str
    module: ModuleType

    def facts(self) -> list:
        return list(getattr(self.module, "FACTS", []))

    def reads(self, ctx: Ctx) -> list:
        fn = getattr(self.module, "reads", None)
        return list(fn(ctx)) if fn else []

    def call(self, hook: str, *args, default=None):
        fn = getattr(self.module, hook, None)
        return fn(*args) if fn else default


def site_order(roles_dir: Path) -> list[str]:
    site = roles_dir / "site.yml"
    data = load_yaml(site)
    if not isinstance(data, list) or not all(isinstance(x, str) for x in data):
        raise InputError("expected a list of role names", file=str(site), line=1)
    return list(data)


def load(selected: str | None, roles_dir: Path) -> list[Role]:
    """The roles of site.yml in order, or the comma list SELECTED (still in site order)."""
    order = site_order(roles_dir)
    names = order
    if selected:
        names = [n.strip() for n in selected.split(",") if n.strip()]
        unknown = [n for n in names if n not in order]
        if unknown:
            raise InputError(
                f"unknown role '{unknown[0]}' in --roles",
                hint=f"roles in roles/site.yml: {', '.join(order)}",
            )
        names = [n for n in order if n in names]
    roles = []
    for name in names:
        path = roles_dir / name / "role.py"
        if not path.is_file():
            raise InputError(
                f"role '{name}' has no {path.relative_to(roles_dir.parent)}",
                file=str(roles_dir / "site.yml"),
            )
        modname = f"nodeprep_roles.{name}"
        module = sys.modules.get(modname)
        if module is None:
            spec = importlib.util.spec_from_file_location(modname, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[modname] = module
            spec.loader.exec_module(module)
        roles.append(Role(name, module))
    return roles
