"""What a job's rank watchers (nodeside/watch.py, one per machine) report, and what nodeprep
decides from it: pure state, no ssh, so every decision is unit-tested with recorded ticks.

- every rank (attempt) with its node, start, end, exit status or signal, OOM kill;
- the first abnormal event (a rank's bad exit or disappearance, a node that stops answering,
  a launcher that fails) -> the job must stop (Slurm's --kill-on-bad-exit, for every launcher);
  under torchrun with --max-restarts a rank's exit is the agent's to handle: only the agent's
  own failure counts;
- a hang: no rank wrote a line or touched its heartbeat for --hang-timeout seconds;
- the summary, root cause first: the earliest failure by the nodes' clocks (rank and node events
  before launcher ones, which are usually consequences), then the other failures, then the
  ranks nodeprep stopped.
"""

from __future__ import annotations

import re
import signal
import time
from collections import deque
from dataclasses import KW_ONLY, dataclass, field
from typing import Callable

from nodeprep.ops.train import tracebacks

TAIL = 15
# A rank's last lines saying its peer went away (gloo's tcp pair, c10d's store, NCCL's remote
# error): its failure is a consequence of another's. Their texts from torch 2.x's sources.
PEER_LOST = re.compile(
    r"Connection reset by peer|Connection closed by peer|Broken pipe"
    r"|remote process exited|ncclRemoteError|failed to recv, got 0 bytes"
)
# How far a consequence's clock may run ahead of its cause's: the wrapper sees its child's death
# after the kernel has closed the child's sockets, and the peer may fail in between.
COLLATERAL_S = 2.0
# A node is silent after this many of its own watcher's tick intervals (never under node_timeout):
# the watcher ticks every 0.25 s: 0.251 s apart on the lab's native nodes, 0.253-0.256 s on its
# emulated aarch64 ones (health under torchrun and deepspeed, 2026-11-27): the 8 s limit there
PACE_TICKS = 20
# Signals on which the rank's faulthandler dumps every Python thread (rank.py)
FATAL = (signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGFPE, signal.SIGILL)


def describe_rc(rc: int | None, oom: bool | None = None) -> str:
    if rc is None:
        return "status unknown"
    if rc >= 0:
        return f"exited with status {rc}"
    try:
        name = signal.Signals(-rc).name
    except ValueError:
        name = f"signal {-rc}"
    if oom:
        return f"was killed by the kernel's OOM killer ({name})"
    return f"was killed by {name}"


@dataclass
class Rank:
    rank: int
    attempt: int
    label: str  # node (or emulated node) it runs on
    start: float
    end: float | None = None
    rc: int | None = None
    oom: bool | None = None
    how: str = "running"  # running | ok | failed | stopped | restarted | vanished

    @property
    def name(self) -> str:
        return f"{self.label} r{self.rank}"


@dataclass
class Failure:
    t: float  # the node's clock (node loss: the last tick seen)
    kind: str  # rank | node | launcher | hang | timeout | interrupted | stopped
    who: str  # "worker-1 r3", "worker-1", a launcher label
    _: KW_ONLY
    what: str
    rank: int | None = None
    prio: int = 0  # 0 rank/node, 1 launcher (usually a consequence)
    fatal: bool = False  # a fatal signal: faulthandler dumped the rank's threads

    @property
    def line(self) -> str:
        return f"{self.who} {self.what}" if self.who else self.what


@dataclass
class RankWatch:
    machines: list[str]  # the nodes whose watchers report
    launchers: list[str]  # labels of the launcher commands (index i: "L:i")
    layout: Callable[[int, dict], str]  # (rank, start record) -> its node label
    names: list[str] = field(default_factory=list)  # node names a launcher may prefix lines with
    restarts: bool = False  # torchrun --max-restarts > 0
    task_labels: bool = False  # srun --label: launcher lines start "N: "
    hang_timeout: float | None = None
    node_timeout: float = 8.0
    started: float = field(default_factory=time.time)

    def __post_init__(self):
        self.ranks: dict[tuple[int, int], Rank] = {}
        self.rank_names: dict[int, str] = {}  # rank -> "worker-1 r3" (per output line: no scan)
        self.failures: list[Failure] = []
        self.tails: dict[str, deque] = {}
        self.last_tick = {m: time.monotonic() for m in self.machines}
        self.ticked: set[str] = set()  # machines heard from at least once
        self.lost_nodes: set[str] = set()
        self.launcher_rc: dict[str, int] = {}
        self.progress = time.monotonic()
        self.stop_t: float | None = None  # wall time nodeprep started stopping the job
        self.stacks: dict[int, list[str]] = {}
        self.warnings: list[str] = []  # a finished rank whose teardown crashed, ...
        self.pace: dict[str, float] = {}  # machine -> its watcher's tick interval (moving average)

    # -- input ------------------------------------------------------------------------------
    def feed(self, machine: str, tick: dict) -> list[tuple[str, str, str]]:
        """One tick from MACHINE's watcher -> output lines (prefix, source, text)."""
        now = time.monotonic()
        if machine in self.ticked:
            gap, old = now - self.last_tick[machine], self.pace.get(machine)
            self.pace[machine] = gap if old is None else 0.8 * old + 0.2 * gap
        self.ticked.add(machine)
        self.last_tick[machine] = now
        out = []
        for ev in tick.get("ev", []):
            kind = ev.get("k")
            if kind == "line":
                out += self._line(machine, ev)
            elif kind == "start":
                self._start(ev)
            elif kind == "exit":
                self._exit(ev)
            elif kind == "vanished":
                self._vanished(ev)
            elif kind == "beat":
                self.progress = time.monotonic()
            elif kind == "launcher":
                self._launcher(ev)
        return out

    def _line(self, machine: str, ev: dict) -> list[tuple[str, str, str]]:
        src, text = ev["src"], ev["text"]
        if src.startswith("L:"):
            i = src[2:]
            label = self.launchers[int(i)] if i.isdigit() and int(i) < len(self.launchers) else i
            prefix, text = self._launcher_prefix(label, text)
            self.tails.setdefault(label, deque(maxlen=TAIL)).append(text)
            return [(prefix, "launcher", text)]
        m = re.match(r"r(\d+)\.(out|err|stack)$", src)
        if not m:
            return []
        rank = int(m.group(1))
        if m.group(2) == "stack":
            self.stacks.setdefault(rank, []).append(text)
            return [(self.rank_name(rank, machine), "stack", text)]
        self.progress = time.monotonic()
        name = self.rank_name(rank, machine)
        self.tails.setdefault(name, deque(maxlen=TAIL)).append(text)
        return [(name, m.group(2), text)]

    def _launcher_prefix(self, label: str, text: str) -> tuple[str, str]:
        # pdsh (DeepSpeed's runner) and srun --label prefix what they relay: keep ONE prefix
        m = re.match(r"([A-Za-z0-9_.\-]+): (.*)$", text)
        if m and m.group(1) in self.names:
            return m.group(1), m.group(2)
        m = re.match(r"\s*\d+: (.*)$", text)
        if m and self.task_labels:
            return label, m.group(1)
        return label, text

    def rank_name(self, rank: int, machine: str) -> str:
        return self.rank_names.get(rank) or f"{machine} r{rank}"

    def _start(self, ev: dict) -> None:
        rank, attempt = int(ev["rank"]), int(ev.get("attempt", 1))
        label = self.layout(rank, ev)
        r = self.ranks[(rank, attempt)] = Rank(
            rank, attempt, label, float(ev.get("start", time.time()))
        )
        self.rank_names[rank] = r.name
        self.progress = time.monotonic()

    def _exit(self, ev: dict) -> None:
        r = self.ranks.get((int(ev["rank"]), int(ev.get("attempt", 1))))
        if r is None:
            return
        r.end, r.rc, r.oom = float(ev.get("end", time.time())), int(ev["rc"]), ev.get("oom")
        if ev.get("teardown_rc") is not None:
            after = r.end - float(ev.get("done_at") or r.end)
            self.warnings.append(
                f"{r.name} {describe_rc(int(ev['teardown_rc']))} in the interpreter's teardown "
                f"{after:.2f}s after its script and exit handlers had ended (counted as done: "
                "nothing of the script was cut short)"
            )
        # a script that failed on its own before any stop began stays a failure even when a
        # TERM (nodeprep's stop, or srun's --kill-on-bad-exit) then ended its teardown
        own = ev.get("failed_at") is not None and (
            self.stop_t is None or float(ev["failed_at"]) < self.stop_t
        )
        if r.rc == 0:
            r.how = "ok"
        elif not own and self._by_our_stop(r.rc, r.end):
            r.how = "stopped"
        elif self.restarts:
            r.how = "restarted"  # torchrun's agent restarts the workers: not a failure yet
        else:
            r.how = "failed"
            # when the script itself failed, where it said (before its exit was seen), and with
            # the status it exited with even when a launcher's TERM then cut its teardown short
            t = min(r.end, float(ev.get("failed_at") or r.end))
            said = ev.get("script_rc")
            what = (
                describe_rc(r.rc, r.oom)
                if said is None or r.rc >= 0
                else (
                    f"{describe_rc(int(said), None)} "
                    f"(then {describe_rc(r.rc, None)} as it shut down)"
                )
            )
            self.failures.append(
                Failure(t, "rank", r.name, what=what, rank=r.rank, fatal=-r.rc in FATAL)
            )

    def _by_our_stop(self, rc: int, end: float) -> bool:
        """An end nodeprep's stop explains: TERM/KILL (or a shell's 143/137 for them) after
        the stop began. A plain exit status, or SIGSEGV/SIGABRT, is the rank's own doing."""
        ours = rc in (
            -signal.SIGTERM,
            -signal.SIGKILL,
            -signal.SIGINT,
            128 + signal.SIGTERM,
            128 + signal.SIGKILL,
        )
        return ours and self.stop_t is not None and end >= self.stop_t - 0.2

    def _vanished(self, ev: dict) -> None:
        r = self.ranks.get((int(ev["rank"]), int(ev.get("attempt", 1))))
        if r is None or r.end is not None:
            return
        r.end, r.how = float(ev.get("end", time.time())), "vanished"
        if self._by_our_stop(-signal.SIGKILL, r.end):
            r.how = "stopped"
        elif not self.restarts:
            self.failures.append(
                Failure(
                    r.end,
                    "rank",
                    r.name,
                    what="vanished without an exit status (its wrapper was killed, e.g. SIGKILL)",
                    rank=r.rank,
                )
            )

    def _launcher(self, ev: dict) -> None:
        i, rc = str(ev["label"]), int(ev["rc"])
        label = self.launchers[int(i)] if i.isdigit() and int(i) < len(self.launchers) else i
        self.launcher_rc[label] = rc
        if rc != 0 and self.stop_t is None:
            self.failures.append(
                Failure(
                    float(ev.get("end", time.time())),
                    "launcher",
                    label,
                    what=f"(the launcher) exited with status {rc}",
                    prio=1,
                )
            )

    def watching(self) -> None:
        """The watchers start now: a machine's silence counts from here."""
        now = time.monotonic()
        self.last_tick = {m: now for m in self.machines}

    def lost(self, machine: str, why: str) -> None:
        """MACHINE's watcher ended or went silent while the job ran."""
        if machine in self.lost_nodes or self.stop_t is not None:
            return
        self.lost_nodes.add(machine)
        seen = time.time() - (time.monotonic() - self.last_tick.get(machine, time.monotonic()))
        self.failures.append(Failure(seen, "node", machine, what=f"stopped answering ({why})"))

    def fail(self, kind: str, what: str) -> None:
        """A failure the controller decides: hang, timeout, interrupted, stopped."""
        self.failures.append(Failure(time.time(), kind, "", what=what, prio=2))

    def stopping(self) -> None:
        if self.stop_t is None:
            self.stop_t = time.time()

    # -- decisions --------------------------------------------------------------------------
    def silence_limit(self, machine: str) -> float:
        """How long MACHINE's watcher may send nothing: node_timeout, or PACE_TICKS of its own
        tick intervals where the node is slower than that allows (an emulated or overloaded
        node: its pace is what it reports, never a guess from its kind)."""
        return max(self.node_timeout, PACE_TICKS * self.pace.get(machine, 0.0))

    def silent(self) -> list[str]:
        """Machines whose watcher sent nothing for their silence limit."""
        now = time.monotonic()
        return [
            m
            for m, t in self.last_tick.items()
            if m not in self.lost_nodes and now - t > self.silence_limit(m)
        ]

    def hung(self) -> bool:
        return bool(self.hang_timeout) and time.monotonic() - self.progress > self.hang_timeout

    def done(self) -> bool:
        return len(self.launcher_rc) == len(self.launchers) and not self.failures

    def alive(self) -> list[Rank]:
        return [r for r in self.ranks.values() if r.end is None]

    # -- summary ----------------------------------------------------------------------------
    def exits(self) -> dict:
        """ "worker-1 r3" (" (attempt 2)") -> how, rc, oom, start, end and status: exits.json."""
        return {
            r.name + (f" (attempt {r.attempt})" if r.attempt > 1 else ""): {
                "how": r.how,
                "rc": r.rc,
                "oom": r.oom,
                "start": r.start,
                "end": r.end,
                "status": describe_rc(r.rc, r.oom) if r.rc is not None else r.how,
            }
            for r in sorted(self.ranks.values(), key=lambda r: (r.rank, r.attempt))
        }

    def root_cause(self) -> Failure | None:
        """The earliest failure, launchers' last; a rank that failed because its peer went
        away yields to a failure of another kind up to COLLATERAL_S later (a rank SIGKILLed
        closes its sockets before its wrapper sees it die)."""
        if not self.failures:
            return None
        first = min(self.failures, key=lambda f: (f.prio, f.t))
        if not self._collateral(first):
            return first
        causes = [
            f
            for f in self.failures
            if f.prio == first.prio and not self._collateral(f) and f.t - first.t <= COLLATERAL_S
        ]
        return min(causes, key=lambda f: f.t) if causes else first

    def described(self, f: Failure) -> str:
        """F's line; for a rank a fatal signal ended, where its main thread was (from the dump
        its faulthandler wrote), e.g. "... by SIGABRT in torch (destroy_process_group) called
        at train.py:44 in main"."""
        if not f.fatal or f.rank is None:
            return f.line
        dumps = tracebacks.parse("\n".join(self.stacks.get(f.rank, [])) + "\n")
        main = tracebacks.main_thread(dumps[-1]) if dumps else None
        if main is None or not main.frames:
            return f.line
        lib, user = tracebacks.waits_in(main.frames), tracebacks.where(main.frames)
        return f"{f.line} in {lib} called at {user}" if lib else f"{f.line} at {user}"

    def _collateral(self, f: Failure) -> bool:
        return f.kind == "rank" and any(PEER_LOST.search(t) for t in self.tails.get(f.who, ()))

    def stop_seconds(self) -> float | None:
        """From the root cause to the last rank gone (the nodes' clocks)."""
        root = self.root_cause()
        ends = [r.end for r in self.ranks.values() if r.end is not None]
        if root is None or not ends or root.kind in ("timeout", "interrupted", "stopped"):
            return None
        return max(0.0, max(ends) - root.t)
