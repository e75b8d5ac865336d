"""`invoke verify-parity`: one batched probe per node (all nodes in parallel), turned into a flat
fingerprint per node (ops/verify/checks.py), compared by ops/verify/parity.py, plus the checks that
catch hangs before a launch and the ssh mesh (real logins from the head, every pair on paper).

Beyond 4 nodes the probes ride the head's mesh logins (engine/transports/fanout.py): one connection
from here, N logins in all. A node the head cannot reach, or whose answer came back broken, is
probed over its own connection."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from nodeprep.commands import collective as collmod
from nodeprep.commands.common import container_images, select_hosts
from nodeprep.commands.options import TrainOptions, VerifyOptions
from nodeprep.engine import facts as factmod
from nodeprep.engine import hostkeys
from nodeprep.engine.events import Events
from nodeprep.engine.fleet import Fleet
from nodeprep.engine.transports import fanout, slurmrun
from nodeprep.inventory import nodeset
from nodeprep.ops.provision.topology import Topology
from nodeprep.ops.ssh import paper_mesh
from nodeprep.ops.ssh.logins import fans_out, mesh_collect, mesh_pairs, mesh_start, parse_mesh
from nodeprep.ops.verify import checks, fingerprints, parity
from nodeprep.settings import Settings


@dataclass
class VerifyResult:
    report: parity.Report
    collective: dict | None = None  # --collective: the all_reduce's result
    notes: list[str] = field(default_factory=list)  # how the mesh and probes were done

    @property
    def exit_code(self) -> int:
        return 0 if self.report.ok else 1


@dataclass
class Probe:
    """One node's answer: its facts, the `python` its ssh shell finds, its mesh logins, and
    what NCCL's own log said there in --collective (collective.by_node; empty on gloo)."""

    facts: factmod.FactValues | None
    mesh: dict = field(default_factory=dict)  # peer -> (rc, error)
    nccl: dict = field(default_factory=dict)

    @property
    def python_seen(self):
        return self.facts.get(factmod.PYTHON_ON_PATH) if self.facts is not None else None


class Gather:
    """Probes every selected node, directly or through the head's logins."""

    def __init__(self, fleet, hosts, v_of: dict, opts: VerifyOptions, pairs: dict, images: dict):
        self.fleet = fleet
        self.hosts = hosts
        self.v_of = v_of
        self.opts = opts
        self.pairs = pairs
        self.head = hosts[0].name
        self.images = images  # node -> the container image it must hold (None: the venv way)

    def requests(self, node: str) -> list:
        return fingerprints.requests(self.v_of[node], self.opts.deep, self.expect(node))

    def expect(self, node: str) -> fingerprints.Expect:
        return fingerprints.Expect(
            self.opts.workdir,
            self.opts.port if node == self.head else None,
            self.hosts[0].address,
            image=self.images.get(node),
        )

    def node(self, session, peers: list[str]) -> Probe:
        """ONE remote command: the mesh logins start in the background, the fact probe runs
        meanwhile (it also answers what `python` a launcher's non-interactive ssh shell
        finds), then the logins' results are collected."""
        reqs, token = self.requests(session.name), secrets.token_hex(6)
        script = (
            mesh_start(peers)
            + factmod.probe_script(reqs, self.v_of[session.name], token)
            + f"echo '@@{token}:mesh@@'\n"
            + mesh_collect(peers)
            + f"echo '@@{token}:rc=0@@'\n"
        )
        r = session.run(
            script, label=f"verify probe + ssh mesh ({len(peers)} peers)", log_output=False
        )
        f = factmod.parse_sections(session.name, reqs, r.stdout, token, r.rc, r.tail(3))
        mesh = parse_mesh(factmod.split_sections(r.stdout, token).get("mesh", ("", 0))[0])
        for p in peers:
            mesh.setdefault(p, (-1, "no answer from the mesh check"))
        return Probe(f, mesh)

    def via_head(self, session):
        return fanout.probe_via_head(
            session,
            self.hosts,
            {h.name: self.requests(h.name) for h in self.hosts},
            self.v_of,
            self.pairs[self.head],
            int(self.fleet.settings.command_timeout),
        )

    def all(self) -> dict[str, Probe]:
        """{node: Probe} of the nodes that answered. Fanned out: ONE connection from here, to
        the head, whose mesh logins carry every node's probe; the rest directly."""
        fleet, head = self.fleet, self.head
        if fleet.transport is not None or not fans_out(self.pairs, head, self.opts.via):
            return fleet.map(lambda s: self.node(s, self.pairs.get(s.name, [])), "probe")
        got: dict[str, Probe] = {}
        fan = fleet.map(self.via_head, "probe", only=[head])
        if fan.get(head) is None:  # the fan-out failed as a whole: the head logs in directly
            fan.pop(head, None)
        else:
            answers, head_mesh = fan[head]
            got = {n: Probe(f) for n, f in answers.items()}
            got.setdefault(head, Probe(None)).mesh = head_mesh
            for n in answers:
                if n != head:
                    fleet.sessions[n].stage = "probe"
                    fleet.sessions[n].log(f"probed through {head}'s ssh login (mesh check)\n")
        rest = [h.name for h in self.hosts if h.name not in got or got[h.name].facts is None]
        if rest:
            # the head's own logins: done already if the fan-out ran, else now, beside its probe
            head_peers = [] if head in fan else self.pairs[head]
            direct = fleet.map(
                lambda s: self.node(s, head_peers if s.name == head else []), "probe", only=rest
            )
            for n, g in direct.items():
                g.mesh = got[n].mesh if n in got and got[n].mesh else g.mesh
                got[n] = g
        return {n: g for n, g in got.items() if g.facts is not None}


def _mesh_inputs(hosts, got: dict, v_of: dict, known) -> paper_mesh.PaperMesh:
    """The ssh files each managed node showed, and the controller's pinned keys (parsed once,
    not once per pair). The mesh is the selected HOSTS' (--limit): a job on them needs no
    login to a node outside."""
    paper = {
        n: paper_mesh.NodeFiles({p: g.facts.get(factmod.FILE(p)) for p in paper_mesh.FILES})
        for n, g in got.items()
        if v_of[n].get("ssh_mesh")
    }
    pinned = {
        h.name: {
            k.get_base64()
            for k in (known.lookup(hostkeys.host_entry(h.address, h.port)) or {}).values()
        }
        for h in hosts
        if h.name in paper
    }
    return paper_mesh.PaperMesh(hosts, paper, pinned)


def _compare(inv, gather: Gather, got, fleet) -> parity.Report:
    hosts, v_of, opts = gather.hosts, gather.v_of, gather.opts
    fps = {}
    found = []
    results = fleet.results
    paper = _mesh_inputs(hosts, got, v_of, fleet.store.load())
    for h in hosts:
        if h.name not in got or not results[h.name].usable:
            continue
        f, v = got[h.name].facts, v_of[h.name]
        want = gather.expect(h.name)
        fps[h.name] = fingerprints.with_container(
            fingerprints.with_run(
                fingerprints.fingerprint(v, f, got[h.name].python_seen, opts.workdir),
                got[h.name].nccl,
            ),
            v,
            f,
            want.image,
        )
        found += checks.checks_for(h, v, f, fps[h.name], want)
        found += checks.mesh_checks(h, got[h.name].mesh, v_of, paper)
    found += checks.run_checks(fps, {n: g.nccl for n, g in got.items()})
    unreachable = fleet.unusable()
    order = [h.name for h in hosts]
    if opts.baseline:
        now, old = fingerprints.for_baseline(
            fps, parity.baseline_read(opts.baseline)[0], opts.collective
        )
        report = parity.against_baseline(now, old, fingerprints.SEVERITY, unreachable, order=order)
        report.checks += found
    else:
        report = checks.compare_fleet(
            fps, {h.name for h in hosts if v_of[h.name].get("cpu_only")}, found, unreachable, order
        )
    if opts.save_baseline:
        parity.fingerprint_file_write(opts.save_baseline, fps, {"inventory": inv.name})
    return report


def _notes(
    names: list[str], opts: VerifyOptions, fanned: bool, head: str, direct: list[str]
) -> list[str]:
    out = []
    if opts.mesh != "full" and len(names) > 4:
        out.append(
            f"(ssh mesh: every pair checked on paper (cluster key authorized, host key pinned), "
            f"real logins from {names[0]} to every node; --mesh full logs in over all "
            f"{len(names)}x{len(names)} pairs)"
        )
    if fanned:
        out.append(
            f"(probes rode {head}'s logins"
            + (f"; probed directly: {nodeset.fold(direct)}" if direct else "")
            + "; --via direct connects from here to every node)"
        )
    return out


def _collective(opts: VerifyOptions, settings: Settings, events: Events, fleet) -> dict:
    unreachable = list(fleet.unusable())
    if unreachable:
        return {
            "ok": False,
            "launcher": "torchrun",
            "error": f"skipped: unreachable node(s) {', '.join(unreachable)}",
        }
    return collmod.collective(
        TrainOptions(
            inventory=opts.inventory,
            limit=opts.limit,
            launcher="torchrun",
            payload="allreduce",
            timeout=300,
            port=opts.port or 29500,
        ),
        settings,
        events,
    )


def verify(opts: VerifyOptions, settings: Settings, events: Events) -> VerifyResult:
    opts.validate()
    inv, hosts = select_hosts(opts.inventory, opts.limit, settings, events=events)
    v_of = {h.name: {n: inv.var(h, n) for n in inv.schema} for h in hosts}
    head, names = hosts[0].name, [h.name for h in hosts]
    pairs = mesh_pairs(names, opts.mesh)
    with Fleet(hosts, settings, "verify", events) as fleet:
        # --via slurm (or auto inside an allocation holding the nodes): one srun step per stage
        slurm = slurmrun.use(fleet, "ssh" if opts.via == "direct" else opts.via) == "slurm"
        gather = Gather(
            fleet, hosts, v_of, opts, pairs, container_images(hosts, v_of, settings.state)
        )
        got = gather.all()
        direct = [n for n, s in fleet.sessions.items() if n != head and s.connected]
    # the collective first: what NCCL's log says on each node joins the comparison
    coll = _collective(opts, settings, events, fleet) if opts.collective else None
    for n, logged in ((coll or {}).get("nccl") or {}).items():
        if n in got:
            got[n].nccl = logged
    report = _compare(inv, gather, got, fleet)
    sharing = Topology.of({n: g.facts for n, g in got.items()}, [h.name for h in hosts]).describe()
    if coll is not None and not coll["ok"]:
        report.vetoes.append(f"--collective: {coll.get('error') or 'the all_reduce failed'}")
    fanned = not slurm and fans_out(pairs, head, opts.via)
    return VerifyResult(
        report,
        coll,
        sharing
        + _notes(names, opts, fanned, head, direct if fanned else [])
        + (
            [f"(probes ran as srun steps from {head}; sbcast carried the scripts)"] if slurm else []
        ),
    )
