"""`invoke train`: prepare the job (prepare.py: the probe, the LaunchPlan, preflight, the sync),
turn the plan into the supervisor's RunSpec, and run it to its end under the supervisor
(supervise.py), attached or detached; --dry-run shows the commands instead. With --restarts N
a failed attempt is classed (ops/train/causes.py) and, where ops/train/restarts.py says so,
relaunched without the node it blames (quarantined: ops/train/quarantine.py)."""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from nodeprep.commands.common import select_hosts
from nodeprep.commands.options import TrainOptions
from nodeprep.commands.train import jobvars, slurmdrain, spares, staged
from nodeprep.commands.train.launch import check_slurm, run_spec, shown, supervise
from nodeprep.commands.train.prepare import new_job_id, prepare
from nodeprep.commands.train.runspec import Outcome
from nodeprep.engine.events import Events
from nodeprep.engine.fleet import Fleet
from nodeprep.engine.results import RunLog
from nodeprep.errors import NodeprepError
from nodeprep.ops.train import causes, quarantine, restarts, rundir
from nodeprep.settings import Settings


@dataclass
class TrainResult:
    job_id: str
    where: str  # "2 node(s)", "2 emulated node(s) on worker-0"
    outcome: Outcome = field(default_factory=Outcome)
    commands: dict = field(default_factory=dict)  # --dry-run and srun: node -> its command
    launched: bool = True
    run_dir: str = ""
    detached: bool = False  # the supervisor runs on in the background
    nodes: list[str] = field(default_factory=list)  # the nodes it launched on
    attempts: list[dict] = field(default_factory=list)  # --restarts: each attempt, in order
    stop_reason: str = ""  # --restarts: why no further attempt was made
    private_homes: bool = False  # no two of its nodes share a home (the job directory)
    left_out: list[str] = field(default_factory=list)  # nodes the health gate left out

    @property
    def failure(self) -> str | None:
        return self.outcome.failure

    @property
    def exit_code(self) -> int:
        if self.outcome.failure is None and not self.outcome.leftovers:
            return 0
        return (
            130
            if self.outcome.state == "stopped"
            and (self.outcome.root or {}).get("kind") == "interrupted"
            else 1
        )


def train(opts: TrainOptions, settings: Settings, events: Events) -> TrainResult:
    """The srun command is shown before it runs (events.note), as --dry-run shows every one.
    --detach: prepare here, then the cli starts the supervisor in the background. Quarantined
    nodes are left out, with a note saying how to release them."""
    opts.validate()
    inv, hosts = select_hosts(opts.inventory, opts.limit, settings, events=events)
    pool = _not_quarantined(spares.of(opts, inv), settings, events, need=False)
    hosts = _not_quarantined(
        [h for h in hosts if h.name not in {p.name for p in pool}],
        settings,
        events,
    )
    opts = jobvars.apply(opts, inv, hosts)  # the job's own nodes: spares may differ
    opts.validate()
    if pool:
        events.note(
            pool[0].name,
            f"spares, not launched on: {', '.join(h.name for h in pool)}"
            + ("" if opts.restarts else " (they replace a lost node under --restarts)"),
        )
    if not opts.restarts or opts.dry_run:
        return _attempt(opts, settings, events, inv, hosts)
    if opts.detach:  # the first attempt prepared here; the detached supervisor goes on
        res = _attempt(opts, settings, events, inv, hosts)
        if res.detached:
            kept = dataclasses.replace(opts, min_nodes=opts.min_nodes or len(hosts))
            rundir.RunDir(Path(res.run_dir)).write_json(
                LOOP,
                {"opts": asdict(kept), "private_homes": res.private_homes, "left": res.left_out},
            )
        return res
    return _with_restarts(opts, settings, events, inv, _Start(hosts, pool))


# in each run of a --restarts job: the loop's pid and start time while it runs (train.stop
# signals it between attempts); a detached job's first run also keeps the loop's options
LOOP = "restarts.json"


def go_on_detached(path: Path, first: Outcome, settings: Settings, events: Events):
    """The detached supervisor's part of `train --restarts --detach`: the restart loop from
    the first attempt's OUTCOME (its run at PATH) on. None when PATH's job has no restarts."""
    loop = rundir.read_json(path / LOOP)
    if not loop:
        return None
    raw = {k: tuple(v) if isinstance(v, list) else v for k, v in loop["opts"].items()}
    opts = TrainOptions(**{**raw, "detach": False})
    _mark([path], alive=True)
    inv, hosts = select_hosts(opts.inventory, opts.limit, settings, events=events)
    spec = rundir.read_json(path / "job.json")
    first_res = TrainResult(
        spec["job_id"],
        spec.get("where", ""),
        first,
        run_dir=str(path),
        nodes=list(spec["nodes"]),
        private_homes=loop["private_homes"],
        left_out=list(loop.get("left") or ()),
    )
    pool = _not_quarantined(spares.of(opts, inv), settings, events, need=False)
    hosts = _not_quarantined(
        [h for h in hosts if h.name not in {p.name for p in pool}], settings, events
    )
    return _with_restarts(opts, settings, events, inv, _Start(hosts, pool, first_res))


def _not_quarantined(hosts, settings: Settings, events: Events, need: bool = True) -> list:
    """HOSTS but the quarantined ones (a note for each); NEED: none left is an error."""
    held = quarantine.load(settings.state)
    out = [h for h in hosts if h.name not in held]
    for h in hosts:
        if h.name in held:
            events.note(
                h.name,
                f"left out: {quarantine.line(h.name, held[h.name])}; "
                f"`invoke train.release --node {h.name}` puts it back",
            )
    if not out and need:
        raise NodeprepError(
            "every selected node is quarantined or a spare",
            hint="`invoke train.release --node NODE` (or --all) once they are fixed",
        )
    return out


def _attempt(opts, settings, events, inv, hosts, restart: int = 0) -> TrainResult:
    """One launch on HOSTS to its end; RESTART: its attempt past the first (the ranks' env).
    --min-nodes: the fewest nodes it may launch on once the health gate has spoken."""
    job_id = new_job_id()
    path = rundir.run_path(settings.runs, job_id)
    path.mkdir(parents=True, exist_ok=True)
    with Fleet(hosts, settings, "train", events, runlog=RunLog(path)) as fleet:
        prep = prepare(opts, inv, hosts, fleet, events, job_id)
        prep.plan = dataclasses.replace(prep.plan, restart=restart)
        where, names = prep.plan.where(), [n.name for n in prep.plan.nodes]
        if len(names) < (opts.min_nodes or 0):  # --restarts' relaunch: too few passed the gate
            return _too_few(job_id, where, names, prep, path, opts.min_nodes)
        staged.before_launch(fleet, names, opts, inv, settings)  # train --stage
        if opts.dry_run:
            return TrainResult(
                job_id, where, commands=shown(prep.plan), launched=False, run_dir=str(path)
            )
        spec = run_spec(prep, opts)
        if restart:  # train.status / train.stop find a relaunch's nodes (spares) by name
            spec.limit = ",".join(names)
        cmds = {label: cmd for label, (_node, cmd) in spec.commands.items()}
        if opts.launcher == "srun":
            for node, cmd in cmds.items():
                events.note(node, cmd)
            check_slurm(fleet, prep.plan.head.name)
        private = len(prep.topo.homes) == len(names) > 1
        if opts.detach:
            rundir.RunDir(path).write_json("job.json", asdict(spec))
            return TrainResult(
                job_id,
                where,
                commands=cmds,
                run_dir=str(path),
                detached=True,
                nodes=names,
                private_homes=private,
                left_out=list(prep.left_out),
            )
        outcome = supervise(spec, fleet, events, path)
        return TrainResult(
            job_id,
            where,
            outcome,
            cmds if opts.launcher == "srun" else {},
            run_dir=str(path),
            nodes=names,
            private_homes=private,
            left_out=list(prep.left_out),
        )


def _mark(dirs: list[Path], alive: bool) -> None:
    """This process as the job's restart loop in each run of DIRS (train.stop finds it there
    between attempts), or, ALIVE false, no longer."""
    me = {"pid": os.getpid(), "since": rundir.proc_start(os.getpid())} if alive else {"pid": None}
    for path in dirs:
        rundir.RunDir(path).write_json(LOOP, {**rundir.read_json(path / LOOP), **me})


@dataclass
class _Start:
    """Where a --restarts job begins: its hosts, the spare hosts (used in order), and the first
    attempt's result when it ran already (the detached supervisor's)."""

    hosts: list
    pool: list
    first: TrainResult | None = None


def _too_few(job_id: str, where: str, names: list, prep, path: Path, need: int) -> TrainResult:
    """A relaunch not launched: NAMES, the nodes the health gate passed, are fewer than NEED."""
    short = Outcome(
        failure=f"{len(names)} node(s) passed the health gate, --min-nodes {need}", state="failed"
    )
    return TrainResult(
        job_id,
        where,
        short,
        launched=False,
        run_dir=str(path),
        nodes=names,
        left_out=list(prep.left_out),
    )


def _with_restarts(opts: TrainOptions, settings, events, inv, start: _Start) -> TrainResult:
    """_loop, and this process no longer named as the job's loop in its runs once it ends."""
    dirs: list[Path] = []
    try:
        return _loop(opts, settings, events, inv, start, dirs)
    finally:
        _mark(dirs, alive=False)


def _loop(opts: TrainOptions, settings, events, inv, start: _Start, dirs: list) -> TrainResult:
    """Attempts until one finishes, or restarts.decide stops the job; each failed attempt's
    blamed node, each node the health gate left out of a relaunch and each spare that could
    not join quarantined as soon as it is known. Ctrl-C between attempts ends the job with the
    attempts so far. DIRS: the attempts' runs (train.stop finds the loop's pid in each)."""
    hosts, pool, first = start.hosts, start.pool, start.first
    need = opts.min_nodes or len(hosts)
    policy = restarts.Policy(opts.restarts, need, frozenset(opts.retry_on) or causes.RETRIED)
    by_name = {h.name: h for h in [*hosts, *pool]}
    attempts: list[dict] = []
    cur, cur_opts, k, res = hosts, opts, 1, None
    try:
        while True:
            started = time.time()
            try:
                res = first or _attempt(cur_opts, settings, events, inv, cur, k - 1)
                if first:
                    started, first = _started(first), None
            except NodeprepError as e:
                if res is None:
                    raise
                # a relaunch that cannot start (a node unreachable at its probe, preflight)
                return _ended(res, attempts, f"relaunch could not start: {e.message}")
            ended = time.time()
            dirs.append(Path(res.run_dir))
            _mark(dirs[-1:], alive=True)
            d, held = _after(res, k, policy, pool, settings)
            if not res.launched:
                d.relaunch, d.why = False, res.failure or "not launched"
            joined = _join_spares(d, pool, held, opts, events)
            restarts.settle(d, list(joined), held.nodes, policy)
            rec = _record(k, res, held, joined, (started, ended))
            if opts.drain and held.nodes:
                rec["slurm"] = _drained(res, held, by_name, settings, events)
            attempts.append(rec)
            for path in dirs:  # train.status of any attempt's run shows them all
                rundir.RunDir(path).write_json("attempts.json", attempts)
            if not d.relaunch:
                res.attempts, res.stop_reason = attempts, d.why
                return res
            k += 1
            for line in _relaunch_lines(res, attempts[-1], d.nodes, k, opts.restarts + 1):
                events.note(d.nodes[0], line)
            time.sleep(restarts.backoff(k))
            cur = [by_name[n] for n in d.nodes]
            cur_opts = dataclasses.replace(
                opts, args=(*opts.args, *opts.resume_args), exclude_unhealthy=True, min_nodes=need
            )
    except KeyboardInterrupt:
        if res is None:
            raise
        return _ended(res, attempts, "interrupted (Ctrl-C) between attempts", interrupted=True)


def _record(k: int, res: TrainResult, held, joined: dict, times: tuple) -> dict:
    """Attempt K as attempts.json keeps it."""
    return {
        "attempt": k,
        "job_id": res.job_id,
        "nodes": res.nodes,
        "failure": res.failure,
        "cause": res.outcome.cause,
        "quarantined": held.nodes,
        "spares": joined,
        "started": round(times[0], 1),
        "ended": round(times[1], 1),
    }


def _started(res: TrainResult) -> float:
    return rundir.read_json(Path(res.run_dir) / "state.json").get("started") or time.time()


@dataclass
class _Held:
    """The nodes an attempt's end quarantined (node -> why), each saved as it is added: a
    Ctrl-C while spares are tried loses none of them."""

    settings: Settings
    job: str
    nodes: dict = field(default_factory=dict)

    def add(self, node: str, why: str) -> None:
        self.nodes[node] = why
        quarantine.add(self.settings.state, node, why, self.job)


def _after(res: TrainResult, k: int, policy, pool: list, settings) -> tuple:
    """(the decision after attempt K's RES, its _Held: the nodes quarantined for it)."""
    c = res.outcome.cause
    cause = causes.Cause(c["klass"], c["node"], c["why"]) if c else None
    d = restarts.decide(cause, k, res.nodes, policy, tuple(h.name for h in pool))
    held = _Held(settings, res.job_id)
    for node in res.left_out:
        held.add(node, "left out by the health gate")
    for node, why in d.quarantine.items():
        held.add(node, why)
    return d, held


def _drained(res: TrainResult, held: _Held, by_name: dict, settings, events) -> list[str]:
    """--drain: the nodes HELD quarantined after RES drained in Slurm (a line each, noted)."""
    peers = [by_name[n] for n in res.nodes if n not in held.nodes and n in by_name]
    lines = slurmdrain.drain_held(list(held.nodes), peers, by_name, settings, events)
    for line in lines:
        events.note(next(iter(held.nodes)), line)
    return lines


def _ended(res: TrainResult, attempts: list, why: str, interrupted: bool = False) -> TrainResult:
    """RES, the last attempt's result, as the job's end: WHY, the attempts so far."""
    root = {"kind": "interrupted"} if interrupted else None
    out = Outcome(failure=why, root=root, state="stopped" if interrupted else "failed")
    return dataclasses.replace(res, outcome=out, attempts=attempts, stop_reason=why)


def _relaunch_lines(res: TrainResult, rec: dict, nodes: list[str], k: int, of: int) -> list[str]:
    """What the user reads before attempt K of OF on NODES, after RES (its record REC):
    "attempt 2/3, 02:14:07: node on worker-3 (...) -> quarantined worker-3; spare worker-9
    provisioned in 41 s, parity OK; relaunching on worker-0, worker-9 in 1s", and a warning
    when rank 0's node left a job whose homes are private (its checkpoint stays there)."""
    line = (
        f"attempt {k}/{of}, {time.strftime('%H:%M:%S')}: {rec['cause']['line']}"
        + (f" -> quarantined {', '.join(rec['quarantined'])}" if rec["quarantined"] else "")
        + "".join(
            f"; spare {n} provisioned in {t:.0f} s, parity OK" for n, t in rec["spares"].items()
        )
        + f"; relaunching on {', '.join(nodes)} in {restarts.backoff(k):g}s"
    )
    if not (res.private_homes and res.nodes[0] != nodes[0]):
        return [line]
    return [
        line,
        f"warning: {res.nodes[0]}, rank 0's node, left the job and its home is its own: a "
        f"checkpoint the script saved in its job directory there is not on {nodes[0]}, the new "
        "head: the script starts without it (a shared home, or a checkpoint path on shared "
        "storage, keeps it)",
    ]


def _join_spares(d, pool: list, held: _Held, opts, events) -> dict:
    """The spares D takes, each converged (spares.converge) and out of POOL: those ready ->
    seconds it took; the others quarantined (HELD) with the reason."""
    joined = {}
    for name in d.take if d.relaunch else ():
        pool[:] = [h for h in pool if h.name != name]
        why, took = spares.converge(name, d.nodes, opts, held.settings, events)
        if why:
            held.add(name, f"spare: {why}")
        else:
            joined[name] = round(took, 1)
    return joined
