"""The nodes of one run (as Fabric's Group): one `Session` per node (engine/session.py),
opened lazily and kept for every stage of the run (facts, then roles, then verification),
bounded parallel fan-out on one thread pool, and a `NodeResult` per node that survives partial
failure: one unreachable node never stops the others. Fabric's ThreadingGroup has no pool
limit, no timeouts and no output prefix, hence this module.
"""

from __future__ import annotations

import os
import secrets
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from fabric import Config

from nodeprep.engine import hostkeys, runners
from nodeprep.engine.bastions import Bastions
from nodeprep.engine.connect_errors import Unreachable
from nodeprep.engine.events import Events
from nodeprep.engine.fds import ensure_open_files
from nodeprep.engine.remote import RUN_VAR, stop_tagged_script
from nodeprep.engine.results import NodeResult, RunLog
from nodeprep.engine.session import Session
from nodeprep.errors import NodeprepError
from nodeprep.settings import Settings

# After Ctrl-C every piece of work left on the nodes (stopping the run's commands, releasing its
# locks, closing) waits at most this long, so the whole command ends within 3 s.
AFTER_INTERRUPT = 1.0


def _exit_now(*_):
    """A second Ctrl-C: leave at once (the first one's cleanup is still under way)."""
    sys.stderr.write("interrupted again: leaving at once\n")
    sys.stderr.flush()
    os._exit(130)


class Fleet:
    """The nodes of one run. `map(fn, stage)` runs fn(session) on every still-usable node in
    parallel (at most settings.width at once) and returns {node: value}."""

    def __init__(
        self,
        hosts,
        settings: Settings,
        task: str,
        events: Events | None = None,
        runlog: RunLog | None = None,
        password: str | None = None,
    ):
        self.settings = settings
        self.events = events or Events()
        self.runlog = runlog or RunLog.create(settings.runs, task)
        self.store = hostkeys.PinnedHostKeys(settings.known_hosts)
        self.bastions = Bastions(settings, self.store, self.events)  # one connection per jump host
        self.fabric_config = Config(
            overrides={"load_ssh_configs": False, "runners": dict(runners.RUNNERS)}
        )
        # tags every remote command of this run (remote.RUN_VAR): unique even for two runs
        # started in the same second by one process
        self.run_id = f"{self.runlog.path.name}-{secrets.token_hex(3)}"
        self.password = password
        self.sessions = {h.name: Session(h, self) for h in hosts}
        soft, want = ensure_open_files(len(self.sessions))
        if soft < want:
            self.events.log(
                f"open-file limit {soft} (hard limit) is below the {want} this run of "
                f"{len(self.sessions)} nodes may need: raise `ulimit -Hn`"
            )
        self.transport = None  # engine/transports/slurmrun.use() sets it (--via slurm)
        self._pool: ThreadPoolExecutor | None = None
        self._in_pool = threading.local()
        self.interrupted: float | None = None  # when Ctrl-C came (time.monotonic)
        self.events.start([h.name for h in hosts])

    def __enter__(self):
        return self

    def __exit__(self, kind, *exc):
        if kind is not None and issubclass(kind, KeyboardInterrupt):
            self.interrupt()
        self.close()

    def close(self):
        if self.transport is not None:
            self.transport.close()
        self._each(lambda s: s.close(), list(self.sessions.values()))
        self.bastions.close()
        if self._pool:
            # after Ctrl-C the workers may still wait on a silent node: nothing waits for them
            self._pool.shutdown(
                wait=self.interrupted is None, cancel_futures=self.interrupted is not None
            )
        self.events.stop()

    def interrupt(self) -> None:
        """Ctrl-C: one line per node saying what it was doing, the run's commands still running
        on the nodes stopped (those that answer; the tag every command carries), and from now on
        every stage waits AFTER_INTERRUPT s at most (lock releases, closing): files written
        atomically stay whole. A second Ctrl-C exits at once."""
        if self.interrupted is not None:
            return
        self.interrupted = time.monotonic()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, _exit_now)
        busy = []
        for s in self.sessions.values():
            if s.doing:
                busy.append(s.name)
                s.result.mark("failed", f"interrupted (Ctrl-C) during {s.stage}: {s.doing}")
                s.result.interrupted = True
            self.events.note(
                s.name,
                f"interrupted during {s.stage}: {s.doing}"
                if s.doing
                else f"interrupted: nothing running there (last stage: {s.stage})",
            )
        stop = stop_tagged_script(RUN_VAR, self.run_id)
        self.cleanup(
            lambda s: s.run(stop, timeout=1, label="stop this run's commands (Ctrl-C)"),
            "interrupt",
            only=busy,
        )

    def _until(
        self, fn: Callable[[Session], None], sessions: list[Session], seconds: float
    ) -> None:
        """FN on every session in threads that nothing waits for after SECONDS (after Ctrl-C:
        a silent node must not hold the command)."""
        threads = [threading.Thread(target=fn, args=(s,), daemon=True) for s in sessions]
        for t in threads:
            t.start()
        end = time.monotonic() + seconds
        for t in threads:
            t.join(max(0.0, end - time.monotonic()))

    def _each(self, fn: Callable[[Session], None], sessions: list[Session]) -> None:
        """FN on every session, at most settings.width at once, on ONE pool of threads kept
        for the run (a pool per stage started N threads per stage: at 64 nodes that was
        half a second of thread starts). A stage started from inside a stage gets its own.
        Under a Slurm transport the transport runs the stage (its runs batched into steps)."""
        if not sessions:
            return
        if self.interrupted is not None:
            self._until(fn, sessions, AFTER_INTERRUPT)
            return
        if self.transport is not None:
            self.transport.each(fn, sessions)
            return
        if getattr(self._in_pool, "yes", False):
            with ThreadPoolExecutor(
                max_workers=max(1, min(self.settings.width, len(sessions)))
            ) as pool:
                list(pool.map(fn, sessions))
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                max_workers=max(1, self.settings.width),
                initializer=lambda: setattr(self._in_pool, "yes", True),
            )
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
        """ONLY: node names to restrict this stage to (default: every usable node). Ctrl-C
        while it runs: interrupt(), then KeyboardInterrupt goes on up."""
        sessions = [s for s in self.usable() if only is None or s.name in only]
        out: dict[str, Any] = {}
        try:
            self._each(lambda s: self._one(fn, s, stage, out), sessions)
        except KeyboardInterrupt:
            self.interrupt()
            raise
        return out

    def _one(self, fn: Callable[[Session], Any], s: Session, stage: str, out: dict) -> None:
        """FN(S) for one node, its failure recorded on the node, not raised (unless the run
        was interrupted: interrupt() already said what the node was doing)."""
        s.stage = stage
        self.events.status(s.name, stage, "running")
        try:
            s.connect()
            out[s.name] = fn(s)
        except Exception as e:
            if self.interrupted is not None:
                return
            self._failed(s, stage, e)
        if self.interrupted is not None:
            return  # cut by the interrupt: interrupt() said what it was doing
        s.doing = None
        s.log(f"== {stage}: {s.result.status} {s.result.message}\n")
        self.runlog.close(s.name, stage)  # open files stay ~width, not N x stages
        self.events.status(s.name, stage, s.result.status, s.result.message)

    @staticmethod
    def _failed(s: Session, stage: str, e: Exception) -> None:
        s.result.error_kind = s.result.error_kind or type(e).__name__  # doctor tells them apart
        if isinstance(e, Unreachable):
            s.result.mark("unreachable", str(e))
        elif s.silent():  # an sftp transfer or a channel cut by the dead-peer rule
            s.result.mark("unreachable", str(s.silence(f"the {stage} stage")))
        elif isinstance(e, NodeprepError):
            s.result.mark("failed", str(e))
        else:  # a bug or an odd remote answer: fail the node, keep the rest
            s.result.mark("failed", f"{stage}: {type(e).__name__}: {e}")

    def cleanup(self, fn: Callable[[Session], Any], stage: str, only=None) -> None:
        """Run FN on every node it concerns that is still connected, failed ones included
        (a lock taken before a step failed must still be released). A node's status is never
        changed here; what went wrong is logged on the node."""
        sessions = [
            s
            for s in self.sessions.values()
            if (only is None or s.name in only) and s.connected and s.result.status != "unreachable"
        ]

        def one(s: Session):
            try:
                fn(s)
            except Exception as e:  # best effort: the run's result is already decided
                s.log(f"== {stage}: {type(e).__name__}: {e}\n")

        self._each(one, sessions)

    def report(self, **extra) -> dict:
        return self.runlog.write_report(self.results, **extra)
