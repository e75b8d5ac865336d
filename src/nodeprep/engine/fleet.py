"""The nodes of one run (as Fabric's Group): one `Session` per node (engine/session.py),
opened lazily and kept for every stage of the run (facts, then roles, then verification),
bounded parallel fan-out on one thread pool, and a `NodeResult` per node that survives partial
failure: one unreachable node never stops the others. Fabric's ThreadingGroup has no pool
limit, no timeouts and no output prefix, hence this module.
"""
from __future__ import annotations

import secrets
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from fabric import Config

from nodeprep.engine import hostkeys, runners
from nodeprep.engine.events import Events
from nodeprep.engine.fds import ensure_open_files
from nodeprep.engine.results import NodeResult, RunLog
from nodeprep.engine.session import Session, Unreachable
from nodeprep.errors import NodeprepError
from nodeprep.settings import Settings


class Fleet:
    """The nodes of one run. `map(fn, stage)` runs fn(session) on every still-usable node in
    parallel (at most settings.width at once) and returns {node: value}."""

    def __init__(self, hosts, settings: Settings, task: str, events: Events | None = None,
                 runlog: RunLog | None = None, password: str | None = None):
        self.settings = settings
        self.events = events or Events()
        self.runlog = runlog or RunLog.create(settings.runs, task)
        self.store = hostkeys.PinnedHostKeys(settings.known_hosts)
        self.fabric_config = Config(overrides={"load_ssh_configs": False, "runners": dict(runners.RUNNERS)})
        # tags every remote command of this run (remote.RUN_VAR): unique even for two runs
        # started in the same second by one process
        self.run_id = f"{self.runlog.path.name}-{secrets.token_hex(3)}"
        self.password = password
        self.sessions = {h.name: Session(h, self) for h in hosts}
        soft, want = ensure_open_files(len(self.sessions))
        if soft < want:
            self.events.log(f"open-file limit {soft} (hard limit) is below the {want} this run of "
                             f"{len(self.sessions)} nodes may need: raise `ulimit -Hn`")
        self.transport = None          # engine/slurmrun.use() sets it (--via slurm)
        self._pool: ThreadPoolExecutor | None = None
        self._in_pool = threading.local()
        self.events.start([h.name for h in hosts])

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        if self.transport is not None:
            self.transport.close()
        self._each(lambda s: s.close(), list(self.sessions.values()))
        if self._pool:
            self._pool.shutdown()
        self.events.stop()

    def _each(self, fn: Callable[[Session], None], sessions: list[Session]) -> None:
        """FN on every session, at most settings.width at once, on ONE pool of threads kept
        for the run (a pool per stage started N threads per stage: at 64 nodes that was
        half a second of thread starts). A stage started from inside a stage gets its own.
        Under a Slurm transport the transport runs the stage (its runs batched into steps)."""
        if not sessions:
            return
        if self.transport is not None:
            self.transport.each(fn, sessions)
            return
        if getattr(self._in_pool, "yes", False):
            with ThreadPoolExecutor(max_workers=max(1, min(self.settings.width, len(sessions)))) as pool:
                list(pool.map(fn, sessions))
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=max(1, self.settings.width),
                                            initializer=lambda: setattr(self._in_pool, "yes", True))
        list(self._pool.map(fn, sessions))

    @property
    def results(self) -> dict[str, NodeResult]:
        return {n: s.result for n, s in self.sessions.items()}

    def usable(self) -> list[Session]:
        """The sessions later stages still run on (NodeResult.usable)."""
        return [s for s in self.sessions.values() if s.result.usable]

    def unusable(self) -> dict[str, str]:
        """{node: why} of the nodes that failed or were unreachable."""
        return {n: s.result.message for n, s in self.sessions.items() if not s.result.usable}

    def map(self, fn: Callable[[Session], Any], stage: str, only=None) -> dict[str, Any]:
        """ONLY: node names to restrict this stage to (default: every usable node)."""
        sessions = [s for s in self.usable() if only is None or s.name in only]
        out: dict[str, Any] = {}

        def one(s: Session):
            s.stage = stage
            self.events.status(s.name, stage, "running")
            try:
                s.connect()
                out[s.name] = fn(s)
            except Unreachable as e:
                s.result.mark("unreachable", str(e))
            except NodeprepError as e:
                s.result.mark("failed", str(e))
            except Exception as e:  # a bug or an odd remote answer: fail the node, keep the rest
                s.result.mark("failed", f"{stage}: {type(e).__name__}: {e}")
            s.log(f"== {stage}: {s.result.status} {s.result.message}\n")
            self.runlog.close(s.name, stage)      # open files stay ~width, not N x stages
            self.events.status(s.name, stage, s.result.status, s.result.message)

        self._each(one, sessions)
        return out

    def cleanup(self, fn: Callable[[Session], Any], stage: str, only=None) -> None:
        """Run FN on every node it concerns that is still connected, failed ones included
        (a lock taken before a step failed must still be released). A node's status is never
        changed here; what went wrong is logged on the node."""
        sessions = [s for s in self.sessions.values()
                    if (only is None or s.name in only) and s.connected
                    and s.result.status != "unreachable"]

        def one(s: Session):
            try:
                fn(s)
            except Exception as e:  # best effort: the run's result is already decided
                s.log(f"== {stage}: {type(e).__name__}: {e}\n")

        self._each(one, sessions)

    def report(self, **extra) -> dict:
        return self.runlog.write_report(self.results, **extra)
