"""`invoke init NAME --from SOURCE`: a first inventory from what the user already has.

--set KEY=VALUE adds what the source does not say (a hostfile has no user or key: --set
user=ops --set key=~/.ssh/id_ed25519): used to reach the nodes and written into the file.
SOURCE is anything `--inventory` reads (`sshconfig:gpu*`, a DeepSpeed/Open MPI hostfile,
`slurm:` inside an allocation, `pbs:`, an Ansible inventory: its groups are kept) or a list of
hosts, `hosts:gpu[01-04],login01`. Each node is contacted once (one facts probe), and
inventory/NAME/hosts.yml is written in nodeprep's native format: how each node is reached, as
the source said (address, port, user, key, jump host), the Python every reached node has, a
login node without GPUs marked `cpu_only`, and as comments what was learned (OS, CPU platform,
GPUs and driver, the NIC that reaches the first node) and the torch build the plan picks for
the fleet. A node that did not answer is written too, with why. An existing inventory is
replaced only with --force; --dry-run writes nothing and returns the text."""

from __future__ import annotations

import re
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path

from nodeprep.commands.common import parse_sets
from nodeprep.commands.options import InitOptions
from nodeprep.engine import facts as factmod
from nodeprep.engine.events import Events
from nodeprep.engine.fleet import Fleet
from nodeprep.errors import InputError, NodeprepError
from nodeprep.inventory import load, writer
from nodeprep.inventory.schema import load_schema
from nodeprep.ops import torchplan
from nodeprep.settings import Settings

NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")


@dataclass
class InitResult:
    name: str
    path: Path
    text: str
    _: KW_ONLY
    written: bool
    unreached: dict[str, str] = field(default_factory=dict)
    next_steps: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 1 if self.unreached else 0


def _target(opts: InitOptions, settings: Settings) -> Path:
    if not opts.name or not NAME.fullmatch(opts.name):
        raise InputError(
            f"inventory name {opts.name!r} is not usable",
            hint="give a name of letters, digits, '.', '_' and '-': "
            "invoke init mycluster --from ...",
        )
    if not opts.source:
        raise InputError(
            "--from is missing",
            hint="say where the hosts are: --from 'sshconfig:gpu*', a "
            "hostfile, slurm:, an Ansible inventory, or hosts:gpu[01-04]",
        )
    path = Path(settings.project) / "inventory" / opts.name / "hosts.yml"
    if path.parent.exists() and any(path.parent.iterdir()) and not (opts.force or opts.dry_run):
        raise InputError(
            f"inventory {opts.name} exists ({path.parent})",
            hint="--force replaces its hosts.yml, or give another name",
        )
    return path


def _source(spec: str) -> str:
    """hosts:LIST is a plain list of names (Slurm's node-list syntax: gpu[01-04],login01)."""
    return "slurm:" + spec[len("hosts:") :] if spec.startswith("hosts:") else spec


def _probe(fleet: Fleet, hosts) -> dict:
    head = hosts[0].address
    reqs = [
        factmod.HOSTNAME,
        factmod.OS,
        factmod.PYTHON,
        factmod.GPUS,
        factmod.INTERFACES,
        factmod.ROUTE(head),
    ]
    got = fleet.map(lambda s: factmod.gather(s, reqs, s.host.vars), "init")
    out = {}
    for name, v in got.items():
        nic = factmod.reaching(v.get(factmod.INTERFACES) or {}, v.get(factmod.ROUTE(head)))
        out[name] = {
            "os": v.get(factmod.OS) or {},
            "python": v.get(factmod.PYTHON),
            "gpus": v.get(factmod.GPUS),
            "nic": nic,
        }
    return out


def _describe(f: dict, head: str) -> str:
    os_, g = f["os"], f["gpus"] or {}
    if g.get("count"):
        names = sorted({d["name"] for d in g.get("devices", [])})
        caps = sorted({d.get("capability") or "?" for d in g.get("devices", [])})
        gpu = f"{g['count']}x {', '.join(names)} ({', '.join(caps)}), driver {g.get('driver')}"
    else:
        gpu = "no NVIDIA GPU" + (f" ({g['error']})" if g.get("error") else "")
    py = f["python"] or {}
    return (
        f"{os_.get('release', '?')}, {os_.get('arch', '?')}, {gpu}; python {py.get('path', '?')} "
        f"{py.get('version', '')}"
        + (f"; NIC {f['nic']} reaches the first node" if f["nic"] else "")
    )


def _reach_values(h) -> dict:
    out = {}
    if h.address != h.name:
        out["address"] = h.address
    if h.port != 22:
        out["port"] = h.port
    for var in ("user", "key"):
        if getattr(h, var):
            out[var] = getattr(h, var)
    if h.jump:
        out["proxy_jump"] = ",".join(str(hop) for hop in h.jump)
    if h.slots is not None:  # a hostfile's slots=N, a nodefile's repeats
        out["slots"] = h.slots
    return out


def _hoist(
    entries: list[writer.NodeEntry], keys=("user", "key", "proxy_jump", "python", "slots")
) -> dict:
    """Values every node has alike move to `vars:`."""
    wide = {}
    for k in keys:
        vals = {repr(e.values.get(k)) for e in entries}
        if len(vals) == 1 and entries[0].values.get(k) is not None:
            wide[k] = entries[0].values[k]
            for e in entries:
                e.values.pop(k, None)
    return wide


def _torch_note(facts: dict, version: str) -> str:
    nodes = [
        torchplan.node_from_facts(
            n, (f["os"] or {}).get("arch"), f["gpus"], not (f["gpus"] or {}).get("count")
        )
        for n, f in facts.items()
    ]
    if not nodes:
        return "torch: no node answered; `invoke torch-plan` once they do"
    try:
        plan = torchplan.choose(version, nodes, torchplan.DEFAULT_INDEX)
    except NodeprepError as e:
        return f"torch {version}: no build fits every node: {str(e).splitlines()[0]}"
    return "torch-plan: " + "; ".join(
        f"{b.cpu_arch} {b.requirement} ({b.variant}"
        + (f", from {b.index_url}" if b.index_url else "")
        + ")"
        for b in plan.builds
    )


def build(opts: InitOptions, inv, facts: dict, unreached: dict, version: str) -> str:
    """The file's text (pure: the source's hosts, what the probe learned)."""
    entries = []
    gpu_fleet = any((f["gpus"] or {}).get("count") for f in facts.values())
    for h in inv.hosts:
        e = writer.NodeEntry(h.name, _reach_values(h))
        if h.name in facts:
            f = facts[h.name]
            e.notes.append(f"{h.name}: {_describe(f, inv.hosts[0].name)}")
            path = (f["python"] or {}).get("path")
            if path and "/.nodeprep/" not in path:  # not a venv nodeprep made: the base python
                e.values["python"] = path
            if gpu_fleet and not (f["gpus"] or {}).get("count"):
                e.values["cpu_only"] = True
        else:
            e.notes.append(
                f"{h.name}: NOT REACHED: {unreached.get(h.name, '?')} "
                "(fix it, then run init --force "
                "or edit this entry)"
            )
        entries.append(e)
    wide = _hoist(entries)
    for k, value in parse_sets(opts.sets).items():  # what --set said, written as said
        if k not in wide and not any(k in e.values for e in entries):
            wide[k] = value
    wide.setdefault("torch_version", version)
    notes = {
        "torch_version": _torch_note(facts, version),
        "python": "the interpreter every node answered with",
    }
    groups = {g: list(m) for g, m in inv.direct.items() if g not in ("all", "ungrouped") and m}
    title = [
        f"inventory {opts.name}: written by `invoke init {opts.name} --from {opts.source}`; "
        "edit freely",
        f"{len(facts)} of {len(inv.hosts)} node(s) answered; variables: docs/values.md",
        "",
    ]
    return writer.render(title, wide, notes, entries, groups)


def init(opts: InitOptions, settings: Settings, events: Events) -> InitResult:
    path = _target(opts, settings)
    inv = load(_source(opts.source), extra_vars=parse_sets(opts.sets), root=settings.project)
    if not inv.hosts:
        raise InputError(
            f"{opts.source}: no hosts in it",
            hint="check the source: `invoke inventory --inventory SOURCE`",
        )
    version = str(load_schema()["torch_version"].default)
    with Fleet(inv.hosts, settings, "init", events) as fleet:
        facts = _probe(fleet, inv.hosts)
        unreached = dict(fleet.unusable())
    text = build(opts, inv, facts, unreached, version)
    if not opts.dry_run:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(".hosts.yml.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    steps = [
        f".venv/bin/invoke provision --inventory {opts.name}",
        f".venv/bin/invoke verify-parity --inventory {opts.name}",
        f".venv/bin/invoke train --inventory {opts.name} --launcher deepspeed --payload health",
    ]
    return InitResult(
        opts.name, path, text, written=not opts.dry_run, unreached=unreached, next_steps=steps
    )
