"""`invoke stage SRC DEST` (and `--name NAME` of the inventory's stages, and `train --stage`):
a dataset, tokenizer or checkpoint on every node's local disk, or each node's shard of it.

For each stage: the source's files and chunk sums (read here, or on the node that holds them),
what each node's destination holds, the room each node needs (every node short of it named,
with the numbers, before anything moves), then the chains (ops/stage/needs.py): one stream
through every node when they all get the same files, each node storing and passing it on, or
one stream per node for shards. Each chunk is checked against its sum as it lands; what an
interruption cut short is resumed by the next run; a second run moves nothing. After the
chains, the arrival check reads every node again; a node a chain failed to fill gets a stream
of its own from the source, once."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from nodeprep.commands.common import select_hosts
from nodeprep.commands.options import StageOptions
from nodeprep.engine.events import Events
from nodeprep.engine.fleet import Fleet
from nodeprep.errors import InputError
from nodeprep.inventory.sources import split_origin
from nodeprep.ops.pystack.relay import MeshLogin
from nodeprep.ops.pystack.relay_run import timeout_for
from nodeprep.ops.stage import chain as chains_mod
from nodeprep.ops.stage import needs as lack
from nodeprep.ops.stage import nodes as on_nodes
from nodeprep.ops.stage.spec import Spec, from_inventory
from nodeprep.settings import Settings

GIB = 1 << 30


@dataclass
class NodeStage:
    node: str
    status: str  # unchanged | staged | would stage | failed
    lacked: int = 0  # bytes it lacked at the start
    files: int = 0  # files it lacked at the start
    via: str = ""  # who fed it: "controller" or a node's name
    error: str = ""

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Staged:
    spec: Spec
    files: int = 0
    nbytes: int = 0
    nodes: list[NodeStage] = field(default_factory=list)
    sent_here: int = 0  # bytes the controller sent
    seconds: float = 0.0
    chained: bool = False
    verified: bool = False  # --verify: every staged file hashed on its node

    @property
    def ok(self) -> bool:
        return all(n.status != "failed" for n in self.nodes)

    def as_dict(self) -> dict:
        s = self.spec
        return {
            "name": s.name,
            "src": s.src,
            "dest": s.dest,
            "from": s.from_node,
            "shard": s.shard,
            "files": self.files,
            "bytes": self.nbytes,
            "controller_sent": self.sent_here,
            "seconds": round(self.seconds, 2),
            "chained": self.chained,
            "verified": self.verified,
            "nodes": [n.as_dict() for n in self.nodes],
        }


@dataclass
class StageResult:
    stages: list[Staged]
    dry_run: bool = False

    @property
    def exit_code(self) -> int:
        return 0 if all(s.ok for s in self.stages) else 1

    def as_dict(self) -> dict:
        return {"dry_run": self.dry_run, "stages": [s.as_dict() for s in self.stages]}


def specs_for(opts: StageOptions, inv, hosts) -> list[Spec]:
    """The stages OPTS names: SRC DEST, or the inventory's by --name (the value the selected
    nodes share)."""
    names = {h.name for h in inv.hosts} if hasattr(inv, "hosts") else set()
    if not opts.names:
        if opts.from_node and opts.from_node not in names:
            raise InputError(f"stage: --from {opts.from_node!r} is not a node of the inventory")
        return [Spec("", opts.src or "", opts.dest or "", opts.shard, opts.from_node)]
    from nodeprep.commands.train.jobvars import shared

    value = shared(inv, hosts, "stages")
    where = split_origin(hosts[0].origin.get("stages", ""))
    return from_inventory(value, list(opts.names), where, names)


def stage(opts: StageOptions, settings: Settings, events: Events) -> StageResult:
    opts.validate()
    inv, hosts = select_hosts(opts.inventory, opts.limit, settings, events=events)
    specs = specs_for(opts, inv, hosts)
    extra = [h for s in specs if s.from_node for h in inv.select(s.from_node) if h not in hosts]
    with Fleet(hosts + extra, settings, "stage", events) as fleet:
        return StageResult(
            [run_one(fleet, [h.name for h in hosts], s, opts, settings) for s in specs],
            opts.dry_run,
        )


def run_one(fleet, order: list[str], spec: Spec, opts: StageOptions, settings) -> Staged:
    """One stage over the nodes ORDER names (their order is the ranks' for shards)."""
    t0 = time.monotonic()
    manifest = _manifest(fleet, spec, settings)
    gets = lack.shards(manifest, order, spec.shard)  # the ranks' shards, over every node
    targets = [n for n in order if not (n == spec.from_node and spec.src == spec.dest)]
    states = fleet.map(lambda s: on_nodes.read_state(s, spec.dest, opts.verify), "stage", targets)
    sharers = _sharers([n for n in targets if n in states], states, gets)
    targets = [n for n in targets if n in states and n not in sharers]
    wants = {n: lack.needs(gets[n], states[n]) for n in targets}
    _check_room(spec, wants, states)
    out = Staged(spec, len(manifest.entries), manifest.nbytes, verified=opts.verify)
    out.nodes = [
        NodeStage(n, "unchanged", sum(x.nbytes for x in wants[n]), len(wants[n])) for n in targets
    ]
    out.nodes += [NodeStage(n, "failed", error=m) for n, m in fleet.unusable().items()]
    try:
        return _staged(fleet, spec, opts, out, (gets, wants), t0)
    finally:
        _mirror(out, sharers)


def _sharers(nodes: list[str], states: dict, gets: dict) -> dict[str, str]:
    """{node: the node that fills DEST for it} where nodes see one directory (an NFS home):
    the first of them receives (each shard of theirs, when sharded), the others share it."""
    first: dict[str, str] = {}
    out = {}
    for n in nodes:
        ident = states[n].ident
        if ident is None:
            continue
        lead = first.setdefault(ident, n)
        if lead != n:
            out[n] = lead
            have = {e.path for e in gets[lead]}
            gets[lead] = sorted(gets[lead] + [e for e in gets[n] if e.path not in have],
                                key=lambda e: e.path)  # fmt: skip
    return out


def _mirror(out: Staged, sharers: dict[str, str]) -> None:
    """A node sharing another's DEST ends as that node did."""
    by = {ns.node: ns for ns in out.nodes}
    for n, lead in sharers.items():
        ns = NodeStage(n, by[lead].status if lead in by else "failed", via=f"{lead}'s DEST")
        ns.error = by[lead].error if lead in by else "no answer"
        out.nodes.append(ns)


def _staged(fleet, spec: Spec, opts: StageOptions, out: Staged, plan: tuple, t0: float) -> Staged:
    """The chains, the arrival check and the one retry of a stage whose needs are known."""
    gets, wants = plan
    targets = [ns.node for ns in out.nodes if ns.node in wants]
    if opts.dry_run:
        for ns in out.nodes:
            ns.status = "would stage" if ns.lacked or ns.files else ns.status
    if opts.dry_run or not any(wants.values()):
        return out
    src = spec.src if spec.from_node else str(Path(spec.src).expanduser())
    flow = chains_mod.Flow(src, spec.dest, spec.from_node, _logins(fleet))
    flow.progress = _Progress(fleet.events)
    relay = opts.relay and len([n for n in targets if wants[n]]) > 1
    try:
        _pass(fleet, lack.chains(wants, targets, spec.shard, relay), flow, out)
        out.chained = relay and not spec.shard
        again = _arrived(fleet, spec, gets, opts, out, final=False)
        if again:  # a chain that did not fill them: a stream each from the source, once
            fleet.events.log(f"stage: {len(again)} node(s) not filled by the chain; direct now")
            _pass(fleet, lack.chains(again, targets, True, False), flow, out)
            _arrived(fleet, spec, gets, opts, out, final=True)
    finally:
        fleet.cleanup(lambda s: s.run(chains_mod.cleanup_script(flow.token)), "stage cleanup")
    out.sent_here, out.seconds = flow.sent, time.monotonic() - t0
    for ns in out.nodes:
        if ns.status == "failed" and not ns.error:
            said = list(dict.fromkeys(flow.said.get(ns.node, [])))  # each pass may say it
            ns.error = "; ".join(said[:2]) or flow.failed.get(ns.node, "")
    return out


def _manifest(fleet, spec: Spec, settings) -> lack.Manifest:
    if spec.from_node:
        return on_nodes.scan_node(fleet.sessions[spec.from_node], spec.src)
    return on_nodes.scan_local(Path(spec.src).expanduser(), settings.state / "stage")


def _logins(fleet) -> dict[str, MeshLogin]:
    return {
        n: MeshLogin(s.host.address, int(s.host.port or 22), s.host.user)
        for n, s in fleet.sessions.items()
    }


def _check_room(spec: Spec, wants: dict, states: dict) -> None:
    short = {n: lack.short_of_room(w, states[n]) for n, w in wants.items()}
    short = {n: b for n, b in short.items() if b}
    if short:
        told = "; ".join(
            f"{n} needs {_gib(sum(x.nbytes for x in wants[n]))}, has {_gib(states[n].free)} free"
            for n in sorted(short)
        )
        raise InputError(
            f"stage {spec.title}: not enough room on {len(short)} node(s): {told}",
            hint="free space there, pick another dest, or stage a shard per node (--shard)",
        )


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / (1 << 20):.1f} MiB"


def _pass(fleet, chains: list, flow, out: Staged) -> None:
    """Every chain of one pass at once; Ctrl-C stops them all (the fleet's interrupt)."""
    for c in chains:
        head = flow.source_node or "the controller"
        for i, n in enumerate(c.nodes):
            ns = next(x for x in out.nodes if x.node == n)
            ns.via = c.nodes[i - 1] if i else (flow.source_node or "controller")
        fleet.events.log(
            f"stage: {_gib(c.nbytes)} to {', '.join(c.nodes)}, "
            f"{'chained ' if len(c.nodes) > 1 else ''}from {head}"
        )
        for n in c.nodes:
            flow.progress.total[n] = c.nbytes
        chains_mod.put_hops(fleet, c, flow, timeout_for(c.nbytes, len(c.nodes)))
    threads = [
        threading.Thread(
            target=chains_mod.run_chain,
            args=(fleet, c, flow, timeout_for(c.nbytes, len(c.nodes))),
            daemon=True,
        )
        for c in chains
    ]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(0.2)
    except KeyboardInterrupt:
        fleet.interrupt()
        raise


def _arrived(fleet, spec: Spec, gets: dict, opts, out: Staged, final: bool) -> dict:
    """The arrival check: each node read again; {node: what it still lacks}. FINAL: a node
    still lacking anything is failed."""
    names = [ns.node for ns in out.nodes if ns.status != "failed"]
    states = fleet.map(lambda s: on_nodes.read_state(s, spec.dest), "stage check", names)
    left = {}
    for ns in out.nodes:
        if ns.node not in names:
            continue
        if ns.node not in states:
            ns.status, ns.error = "failed", fleet.unusable().get(ns.node, "no answer")
            continue
        short = lack.needs(gets[ns.node], states[ns.node])
        if not short:
            ns.status = "staged" if (ns.lacked or ns.files) else "unchanged"
        elif final:
            ns.status = "failed"
        else:
            left[ns.node] = short
    return left


class _Progress:
    """A node's bytes so far -> its status line: how much of its stream, the rate, time left."""

    def __init__(self, events: Events):
        self.events, self.total, self.t0 = events, {}, {}

    def __call__(self, node: str, nbytes: int) -> None:
        now = time.monotonic()
        t0 = self.t0.setdefault(node, now)
        total = max(self.total.get(node, 0), nbytes, 1)
        rate = nbytes / (now - t0) if now > t0 else 0.0
        left = f", {int((total - nbytes) / rate)} s left" if rate > 0 else ""
        done = min(10, 10 * nbytes // total)
        self.events.status(
            node,
            "stage",
            "running",
            f"[{'#' * done}{'.' * (10 - done)}] {_gib(nbytes)} of {_gib(total)}, "
            f"{rate / 1e6:.0f} MB/s{left}",
        )
