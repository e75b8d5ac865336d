"""The Slurm transport at work (--via slurm): Session.run batched into srun steps.

`use(fleet, via)` decides the transport and, for Slurm, connects to the head (the first
selected node: a login node of the cluster, as `train --launcher srun` uses it), checks that
it can run srun/sbcast/salloc, and maps every inventory node to its Slurm node (a node Slurm
does not know is an InputError naming it: exit 2, before any step runs).

Then every stage of the fleet runs through `Transport.each`: one thread per node; a node's
`session.run(script)` queues the script and waits; when every node of the stage has either
queued a script or finished its function, ONE srun step runs all the queued scripts (engine/
slurm.py builds it) and each caller gets its own CmdResult. A function that runs three
commands makes three steps, each over the nodes still at it. A run outside any stage (from
the command's own thread) is a step of one node.

The allocation: inside one (SLURM_JOB_ID in the controller's environment) every step runs in
it; otherwise each step makes its own (salloc on the head, --immediate, a time limit just
above the step's), so nothing is left allocated when a step ends, fails or is interrupted.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shlex
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from nodeprep.engine.remote import SHA256_SH
from nodeprep.engine.session import CmdResult
from nodeprep.engine.transports import slurm
from nodeprep.errors import InputError, NodeprepError
from nodeprep.inventory import nodeset

VIAS = ("auto", "ssh", "slurm")
_tls = threading.local()


def allocation(env=None) -> tuple[str | None, list[str] | None]:
    """(job id, its nodes) of the allocation the controller runs in, or (None, None)."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not job or not job.isdigit():
        return None, None
    try:
        nodes = [
            n
            for p in nodeset.split_list(env.get("SLURM_JOB_NODELIST", ""))
            for n in nodeset.expand(p)
        ]
    except ValueError:
        nodes = []
    return job, nodes


def resolve(via: str, hosts, env=None) -> str:
    """ssh or slurm. auto: slurm inside an allocation that holds every selected node (by
    name), else ssh; the ssh path stays the default."""
    if via not in VIAS:
        raise InputError(f"--via {via!r}: expected {', '.join(VIAS)}")
    if via != "auto":
        return via
    job, nodes = allocation(env)
    return "slurm" if job and nodes and {h.name for h in hosts} <= set(nodes) else "ssh"


def use(fleet, via: str) -> str:
    """Set FLEET's transport for VIA (auto|ssh|slurm); returns the one chosen."""
    hosts = [s.host for s in fleet.sessions.values()]
    chosen = resolve(via, hosts)
    if chosen == "slurm":
        t = Transport(fleet)
        t.start()
        fleet.transport = t
        for s in fleet.sessions.values():
            s.transport = t
    return chosen


class _Round:
    """One stage: N participants; a flush when none of them is still working."""

    def __init__(self, transport: "Transport", n: int):
        self.t, self.cv = transport, threading.Condition()
        self.working = n
        self.queue = []
        self.flushing = False

    def call(self, fn, session):
        _tls.round = self
        try:
            fn(session)
        finally:
            _tls.round = None
            with self.cv:
                self.working -= 1
            self._maybe_flush()

    def submit(self, item: list) -> CmdResult:
        with self.cv:
            self.queue.append(item)
            self.working -= 1
        self._maybe_flush()
        with self.cv:
            while item[3] is None:
                self.cv.wait()
        return item[3]

    def _maybe_flush(self):
        while True:
            with self.cv:
                if self.flushing or self.working > 0 or not self.queue:
                    return
                batch = self.queue
                self.queue = []
                self.flushing = True
            try:
                self.t.batch(batch)
            finally:
                with self.cv:  # the batch's callers work again (counted before they wake)
                    self.working += len(batch)
                    self.flushing = False
                    self.cv.notify_all()


class Transport:
    """Runs the fleet's scripts as srun steps from the head."""

    def __init__(self, fleet):
        self.fleet = fleet
        self.head = next(iter(fleet.sessions.values()))
        self.jobid, self.job_nodes = allocation()
        self.slurm: dict[str, str] = {}  # inventory node -> Slurm node
        self._reached: set[str] = set()
        self._lock = threading.Lock()
        self._prev: str | None = None  # the last step's token (its file to remove)
        self.steps: list[dict] = []  # per step: nodes, bytes sent, seconds

    def close(self) -> None:
        """The last step's bundle off every node, by a step the head runs in the background
        (the run does not wait for it; best effort: at worst a 0600 file is left in /tmp)."""
        if self._prev:
            try:
                self.head.run_ssh(
                    slurm.cleanup_script(list(self.slurm.values()), self._prev, self.jobid),
                    30,
                    "slurm: the last step's file off the nodes (background)",
                )
            except Exception:  # noqa: BLE001
                pass

    def is_head(self, session) -> bool:
        return session is self.head

    def reached(self, session) -> bool:
        return session.name in self._reached

    def start(self) -> None:
        head = self.head
        head.stage = "connect"
        checks = "; ".join(
            f"command -v {t} >/dev/null || echo '@@missing {t}'" for t in slurm.TOOLS
        )
        r = head.run_ssh(f"{checks}; {slurm.SINFO}", 60, "slurm: tools and nodes (sinfo)")
        missing = [ln.split()[1] for ln in r.stdout.splitlines() if ln.startswith("@@missing ")]
        if missing:
            raise InputError(
                f"--via slurm: {', '.join(missing)} not found on {head.name} (the head "
                "runs the Slurm steps)",
                hint="run from a cluster whose first selected "
                "node is a Slurm login node, or use --via ssh",
            )
        if r.rc != 0:
            raise NodeprepError(
                f"--via slurm: sinfo on {head.name} failed: {r.tail(2)}",
                hint="is slurmctld up? or use --via ssh",
            )
        hosts = [s.host for s in self.fleet.sessions.values()]
        self.slurm = slurm.node_map(
            hosts, r.stdout, head.name, self.job_nodes if self.jobid else None
        )

    # -- stages and runs ------------------------------------------------------------------
    def each(self, fn, sessions) -> None:
        """FN on every session, one thread each (a stage's steps wait for all its nodes)."""
        r = _Round(self, len(sessions))
        with ThreadPoolExecutor(max_workers=len(sessions)) as pool:
            list(pool.map(lambda s: r.call(fn, s), sessions))

    def run(self, session, script: str, limit: int) -> CmdResult:
        item = [session, script, limit, None]
        r = getattr(_tls, "round", None)
        if r is None:
            self.batch([item])
            return item[3]
        return r.submit(item)

    def batch(self, items: list[list]) -> None:
        """ONE srun step for ITEMS ([session, script, limit, result]); fills in each result."""
        try:
            answers = self._step(
                [(self.slurm[s.name], script, limit) for s, script, limit, _ in items]
            )
        except Exception as e:  # noqa: BLE001 -- every caller gets the failure as its own
            answers = {
                self.slurm[s.name]: slurm.Answer(255, "", f"slurm step failed: {e}")
                for s, *_ in items
            }
        for item in items:
            a = answers[self.slurm[item[0].name]]
            if a.rc != 255:
                self._reached.add(item[0].name)
            item[3] = CmdResult(a.rc, a.stdout, a.stderr, a.timed_out)

    def _step(self, items: list[tuple[str, str, int]]) -> dict[str, slurm.Answer]:
        token = secrets.token_hex(8)
        text = slurm.bundle(items, token, self._prev)
        limit = max(lim for _n, _s, lim in items)
        nodes = [n for n, _s, _l in items]
        with self._lock:  # one step at a time: the head's connection and its sftp
            path = self._upload(text.encode(), token)
            head = slurm.head_script(nodes, token, limit, self.jobid, path)
            r = self.head.run_ssh(
                head,
                limit + 90,
                f"srun step over {len(nodes)} node(s) ({len(text)} bytes of scripts)",
            )
        self._prev = token
        self.steps.append({"nodes": len(nodes), "bytes": len(text) + len(head)})
        return slurm.parse(r.stdout, token, nodes, {n: lim for n, _s, lim in items})

    def _upload(self, data: bytes, token: str) -> str:
        """DATA as a 0600 file on the head (one sftp write: a script of any size)."""
        self.head._ssh()
        path = f"/tmp/nodeprep-bundle-{token}.sh"
        sftp = self.head.conn.sftp()
        with sftp.open(path, "wx") as f:
            f.chmod(0o600)
            f.write(data)
        return path

    def broadcast(self, local_path, remote_path: str, nodes: list[str]) -> dict[str, str]:
        """The file at LOCAL_PATH to REMOTE_PATH on NODES (inventory names) via the head's
        sbcast; {node: error} for those whose copy is not there whole."""
        return broadcast(
            self.head,
            local_path,
            remote_path,
            [self.slurm[n] for n in nodes],
            jobid=self.jobid,
            names={self.slurm[n]: n for n in nodes},
        )


def broadcast(
    head,
    local_path,
    remote_path: str,
    nodes: list[str],
    *,
    jobid: str | None = None,
    names: dict | None = None,
) -> dict[str, str]:
    """Push LOCAL_PATH once to HEAD (a Session on a Slurm login node), then `sbcast` it to
    REMOTE_PATH (absolute) on NODES (Slurm node names), inside JOBID or an allocation of its
    own; every node's copy is then checked against the sha256 in the same step. Returns
    {node: error} for the nodes whose copy is missing or wrong (NAMES: Slurm -> inventory
    name, for the keys); {} when every copy is right."""
    if not remote_path.startswith("/"):
        raise InputError(
            f"broadcast to {remote_path!r}: give an absolute path (sbcast does not expand ~)"
        )
    token = secrets.token_hex(8)
    sha = hashlib.sha256()
    size = 0
    head._ssh()
    src = f"/tmp/nodeprep-bcast-{token}"
    # streamed in chunks (a CUDA wheelhouse is GBs): never the whole file in memory
    with open(local_path, "rb") as fin, head.conn.sftp().open(src, "wx") as f:
        f.chmod(0o600)
        f.set_pipelined(True)
        while chunk := fin.read(1 << 20):
            sha.update(chunk)
            f.write(chunk)
            size += len(chunk)
    digest = sha.hexdigest()
    q = shlex.quote(remote_path)
    check = f'{SHA256_SH}; [ "$(np_sha256 < {q})" = {digest} ]'
    bundle_path = f"/tmp/nodeprep-bundle-{token}.sh"
    with head.conn.sftp().open(bundle_path, "wx") as f:
        f.chmod(0o600)
        f.write(slurm.bundle([(n, check, 60) for n in nodes], token).encode())
    script = slurm.head_script(nodes, token, 600, jobid, bundle_path)
    # the file goes out before the step: sbcast of the data, in the same job as the check
    script = script.replace(
        "sbcast -f ", f'sbcast -f {shlex.quote(src)} {q} 2>>"$h/err" || exit 4\nsbcast -f ', 1
    )
    script = script.replace('trap \'rm -rf "$h"', f'trap \'rm -rf "$h" {shlex.quote(src)}', 1)
    r = head.run_ssh(
        script, 700, f"sbcast {Path(local_path).name} ({size} bytes) to {len(nodes)} node(s)"
    )
    answers = slurm.parse(r.stdout, token, nodes, {})
    head.run_ssh(
        slurm.cleanup_script(nodes, token, jobid),
        30,
        "slurm: the check's file off the nodes (background)",
    )
    names = names or {}
    return {
        names.get(n, n): (a.stderr.strip() or f"copy differs (exit {a.rc})")
        for n, a in answers.items()
        if a.rc != 0
    }
