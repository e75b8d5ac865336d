"""Running a prepared job (prepare.py prepares it) and watching it to the end, attached
to the terminal or as a detached supervisor (`train --detach`, cli/detached.py): the same code.

1. One rank watch per machine (nodeside/watch.py over ssh; ops/train/rankwatch decides).
2. Each launcher command starts under `setsid` on its node, output to the node's run
   directory: the job does not depend on the controller's ssh session staying open.
3. Until every launcher ended: on the first abnormal event, on --hang-timeout (after dumping
   every rank's stack), on --timeout, Ctrl-C or `train.stop`: stop every rank on every node
   (TERM, KILL after 5 s), collect the last exits, stop the watchers.
4. Check every node for processes of the job left behind, write the bundle (ops/train/rundir.py);
   the root cause's class (ops/train/causes.py) goes into the Outcome.
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import threading
import time
from dataclasses import asdict

from nodeprep.commands.train import containers
from nodeprep.commands.train.runspec import Outcome, RunSpec
from nodeprep.engine import facts as factmod
from nodeprep.engine.events import Events
from nodeprep.engine.facts.jobs import JOB_VAR
from nodeprep.engine.remote import stop_tagged_script
from nodeprep.errors import NodeprepError
from nodeprep.ops.train import causes, processes, rundir
from nodeprep.ops.train.payload import NODE_RUNS
from nodeprep.ops.train.rankwatch import RankWatch

WATCH_VAR = "NODEPREP_WATCH"
WATCH_STOP = "watch.stop"  # in the run directory: the watchers end (nodeside/watch.py STOP)
STACK_SIGNAL = "RTMIN+4"  # kill -s: the ranks dump their stacks (nodeside/rank.py STACK_SIGNAL)
STACK_WAIT = 3.0


def launch_script(job_id: str, index: int, command: str) -> str:
    """sh: start COMMAND detached (setsid, own session, output to the run directory), tagged
    with the job id, its exit status written when it ends."""
    blob = base64.b64encode(command.encode()).decode()
    base = f'"$d/launcher-{index}"'
    return (
        f'd="$HOME/{NODE_RUNS}/{job_id}"; mkdir -p "$d/ranks" || exit 1\n'
        f"printf %s {blob} | base64 -d > {base}.sh || exit 1\n"
        f'rm -f {base}.rc; cd "$HOME"\n'
        f"env -u NODEPREP_RUN {JOB_VAR}={job_id} setsid /bin/sh -c "
        '\'/bin/sh "$1.sh" > "$1.out" 2>&1 < /dev/null; echo $? > "$1.rc.part"; '
        'mv -f "$1.rc.part" "$1.rc"\' sh ' + base + " < /dev/null > /dev/null 2>&1 &\n"
        "echo started\n"
    )


def watch_script(job_id: str, python: str, agent: str, launchers: list[int], inside="") -> str:
    """sh: the node's rank watch; INSIDE: the exec into the job's container (sh text) when the
    ranks run there (their process ids are the container's)."""
    args = " ".join(f"--launcher {i}" for i in launchers)
    return (
        f'mkdir -p "$HOME/{NODE_RUNS}/{job_id}/ranks"; export {WATCH_VAR}={job_id}; '
        f"exec {inside + ' ' if inside else ''}{shlex.quote(python)} -u "
        f"{shlex.quote(agent + '/watch.py')} {job_id} {args}"
    )


class Supervisor:
    def __init__(self, spec: RunSpec, fleet, events: Events, run_dir: rundir.RunDir):
        self.spec = spec
        self.fleet = fleet
        self.events = events
        self.run_dir = run_dir
        self.lock = threading.Lock()
        self.stop_requested: str | None = None  # set by train.stop (SIGTERM) or Ctrl-C
        self.ended: set[str] = set()  # machines whose watcher said goodbye
        self.news = threading.Event()  # a tick with events came: _wait looks at once
        self.removed = False  # the job's containers (the container way) are gone
        self.started = time.time()
        self.watch = RankWatch(
            list(spec.watchers),
            list(spec.commands),
            spec.label_of,
            names=spec.names,
            restarts=spec.restarts,
            hang_timeout=spec.hang_timeout,
            task_labels=spec.launcher == "srun",
        )

    # -- watchers ----------------------------------------------------------------------------
    def _launchers_on(self, machine: str) -> list[int]:
        """Launchers on MACHINE's watcher's machine (two inventory nodes can be one machine)."""
        return [
            i
            for i, (node, _cmd) in enumerate(self.spec.commands.values())
            if self.spec.machine_of.get(node, node) == machine
        ]

    def _on_tick(self, machine: str, line: str) -> None:
        try:
            tick = json.loads(line)
        except ValueError:
            return
        with self.lock:
            lines = self.watch.feed(machine, tick)
            if tick.get("end"):
                self.ended.add(machine)
        if tick.get("ev"):
            self.news.set()
        for prefix, src, text in lines:
            self.run_dir.line(prefix, src, text)
            if src != "stack" and self._shown(prefix, src):
                self.events.line(prefix, text)

    def _shown(self, prefix: str, src: str) -> bool:
        if self.spec.ranks_shown is None or src == "launcher":
            return True
        return rundir.split_prefix(prefix)[1] in self.spec.ranks_shown

    def _start_watchers(self) -> list[threading.Thread]:
        with self.lock:  # their silence counts from now (the job's containers take a while)
            self.watch.watching()
        threads = []
        for machine, (python, agent) in self.spec.watchers.items():
            s = self.fleet.sessions[machine]
            inside = self.spec.containers.get(machine, {}).get("inside", "")
            script = watch_script(
                self.spec.job_id, python, agent, self._launchers_on(machine), inside
            )

            def one(s=s, machine=machine, script=script):
                try:
                    r = s.run(
                        script,
                        timeout=(self.spec.timeout or 7 * 86400) + 600,
                        label="rank watch",
                        log_output=False,
                        on_line=lambda ln: self._on_tick(machine, ln),
                    )
                    why = f"its ssh session ended, exit {r.rc}"
                except NodeprepError as e:  # silent (the dead-peer rule), or unreachable
                    why = str(e).split(":")[0]
                if machine not in self.ended:
                    with self.lock:
                        self.watch.lost(machine, why)

            t = threading.Thread(target=one, daemon=True)
            t.start()
            threads.append(t)
        return threads

    # -- launch, stop ------------------------------------------------------------------------
    def _launch(self) -> None:
        for i, (label, (node, cmd)) in enumerate(self.spec.commands.items()):
            r = self.fleet.sessions[node].run(
                launch_script(self.spec.job_id, i, cmd), timeout=60, label=f"start {label}"
            )
            if r.rc != 0:
                with self.lock:
                    self.watch.launcher_rc[label] = r.rc
                    self.watch.fail(
                        "launcher", f"{label}: could not start the launcher: {r.tail(3)}"
                    )

    def _stop_all(self) -> dict[str, str]:
        with self.lock:
            self.watch.stopping()
        script = processes.cleanup_script(self.spec.job_id)
        out = self.fleet.map(
            lambda s: s.run(script, timeout=30, label="stop job").stdout.strip(),
            "stop",
            only=[n for n in self.spec.nodes if n not in self.watch.lost_nodes],
        )
        return out

    def _dump_stacks(self) -> None:
        """Every rank's child gets the faulthandler signal (rank.py); the dumps come back
        through the watchers as r<R>.stack lines."""
        with self.lock:
            any_alive = bool(self.watch.alive())
        script = (
            f'for p in $(cat "$HOME/{NODE_RUNS}/{self.spec.job_id}"/ranks/*.start 2>/dev/null '
            "| sed -n 's/.*\"child\": \\([0-9]*\\).*/\\1/p'); do "
            f"/bin/kill -s {STACK_SIGNAL} $p 2>/dev/null; done; true"
        )
        self.fleet.map(
            lambda s: s.run(self._inside(s.name, script), timeout=20, label="dump stacks"),
            "stacks",
            only=[m for m in self.spec.watchers if m not in self.watch.lost_nodes],
        )
        if any_alive:
            time.sleep(STACK_WAIT)

    def _inside(self, node: str, script: str) -> str:
        """SCRIPT (sh) as it sees the ranks: in the job's container on the container way."""
        inside = self.spec.containers.get(node, {}).get("inside")
        return f"{inside} sh -c {shlex.quote(script)}" if inside else script

    # -- the container way (containers.py) ---------------------------------------------------
    def _start_containers(self) -> bool:
        """The job's container on every node before anything runs in it; False (each failure
        recorded) when one would not start."""
        bad = containers.start(self.spec, self.fleet)
        for node, why in bad.items():
            with self.lock:
                self.watch.fail("launcher", f"{node}: the job's container did not start: {why}")
        return not bad

    def _culprit(self) -> tuple[list[int], str]:
        from nodeprep.ops.train import tracebacks

        with self.lock:
            texts = {
                r.rank: "\n".join(self.watch.stacks.get(r.rank, [])) for r in self.watch.alive()
            }
        frames = {}
        for rank, text in texts.items():
            dumps = tracebacks.parse(text)
            main = tracebacks.main_thread(dumps[-1]) if dumps else None
            frames[rank] = main.frames if main else None
        return tracebacks.culprits(frames)

    # -- the loop ----------------------------------------------------------------------------
    def _verdict(self, deadline: float | None) -> str | None:
        with self.lock:
            for m in self.watch.silent():
                self.watch.lost(m, f"no heartbeat for {self.watch.silence_limit(m):.0f}s")
            if self.watch.failures:
                return "failed"
            if self.watch.done():
                return "finished"
            if self.watch.hung():
                return "hang"
        if self.stop_requested:
            return self.stop_requested
        if deadline and time.monotonic() > deadline:
            return "timeout"
        return None

    def _wait(self) -> str:
        deadline = time.monotonic() + self.spec.timeout if self.spec.timeout else None
        last_state = 0.0
        while True:
            self.news.clear()
            verdict = self._verdict(deadline)
            if verdict:
                return verdict
            if time.monotonic() - last_state > 1:
                self.write_state("running")
                last_state = time.monotonic()
            self.news.wait(0.1)

    def run(self) -> Outcome:
        self.run_dir.write_json("job.json", asdict(self.spec))
        try:
            return self._run()
        finally:  # whatever the end, Ctrl-C in any stage included: no container of the job left
            if not self.removed:
                containers.remove(self.spec.containers, self.fleet)

    def _run(self) -> Outcome:
        threads: list[threading.Thread] = []
        try:
            if self._start_containers():
                threads = self._start_watchers()
                self._launch()
            verdict = self._wait()
        except KeyboardInterrupt:
            verdict = "interrupted"
        if verdict == "hang":
            self._dump_stacks()
            ranks, why = self._culprit()
            with self.lock:
                who = ", ".join(self.watch.rank_name(r, "?") for r in ranks) or "job"
                self.watch.fail(
                    "hang",
                    f"hung: no rank wrote output or a heartbeat for "
                    f"{self.spec.hang_timeout:g}s; stacks: {why}",
                )
                self.watch.failures[-1].who = who
                # the clock of a hang starts at the last sign of progress
                self.watch.failures[-1].t = time.time() - (time.monotonic() - self.watch.progress)
        elif verdict == "timeout":
            self.watch.fail("timeout", f"--timeout {self.spec.timeout:g}s reached")
        elif verdict in ("interrupted", "stopped"):
            self.watch.fail(
                verdict,
                "interrupted (Ctrl-C)"
                if verdict == "interrupted"
                else "stopped by `invoke train.stop`",
            )
        if verdict != "finished":
            self._stop_all()
            self._drain(3.0)
        self._end_watchers(threads)
        containers.remove(self.spec.containers, self.fleet)  # before the leftovers are looked for
        self.removed = True
        return self._finish(verdict)

    def _drain(self, seconds: float) -> None:
        """Let the watchers report the ranks' last exits."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            with self.lock:
                if not self.watch.alive():
                    return
            time.sleep(0.1)

    def _end_watchers(self, threads) -> None:
        self.fleet.map(
            lambda s: s.run(
                f'touch "$HOME/{NODE_RUNS}/{self.spec.job_id}/{WATCH_STOP}"',
                timeout=20,
                label="end watch",
            ),
            "end watch",
            only=[m for m in self.spec.watchers if m not in self.watch.lost_nodes],
        )
        for t in threads:
            t.join(timeout=5)
        if any(t.is_alive() for t in threads):
            script = stop_tagged_script(WATCH_VAR, self.spec.job_id)
            self.fleet.map(
                lambda s: s.run(script, timeout=30, label="stop watch"),
                "stop watch",
                only=list(self.spec.watchers),
            )

    def _leftovers(self) -> tuple[dict, int]:
        nodes = [n for n in self.spec.nodes if n not in self.watch.lost_nodes]
        got = self.fleet.map(
            lambda s: factmod.gather(s, [factmod.JOB_PROCESSES]), "leftovers", only=nodes
        )
        left = {
            n: [p for p in v[factmod.JOB_PROCESSES] if p["job"] == self.spec.job_id]
            for n, v in got.items()
        }
        for n, ps in containers.left(self.spec, self.fleet, nodes).items():
            left.setdefault(n, []).extend(ps)
        return {n: ps for n, ps in left.items() if ps}, len(got)

    def _finish(self, verdict: str) -> Outcome:
        w = self.watch
        out = Outcome(
            state="finished"
            if verdict == "finished"
            else ("stopped" if verdict in ("stopped", "interrupted") else "failed")
        )
        out.leftovers, out.checked = self._leftovers()
        with self.lock:
            out.ranks = w.exits()
            out.warnings = list(w.warnings)
            out.pace = {m: round(p, 3) for m, p in w.pace.items()}
            root = w.root_cause()
            if root is not None:
                out.failure, out.root = w.described(root), asdict(root)
                out.others = [
                    w.described(f) for f in sorted(w.failures, key=lambda f: f.t) if f is not root
                ]
                out.stopped = [r.name for r in w.ranks.values() if r.how == "stopped"]
                for who in [root.who] + [f.who for f in w.failures if f is not root]:
                    if who in w.tails and who not in out.tails:
                        out.tails[who] = list(w.tails[who])
                out.stop_seconds = w.stop_seconds()
                out.cause = causes.of_run(out.root, out.tails, self.spec.addresses)
        self.run_dir.write_json("exits.json", out.ranks)
        self.write_state(out.state, out)
        return out

    def write_state(self, state: str, outcome: Outcome | None = None) -> None:
        with self.lock:
            per_node: dict[str, dict] = {}
            for r in self.watch.ranks.values():
                d = per_node.setdefault(r.label, {"alive": 0, "ranks": 0, "last": ""})
                d["ranks"] += 1
                d["alive"] += r.end is None
                tail = self.watch.tails.get(r.name)
                if tail:
                    d["last"] = tail[-1]
            lost = sorted(self.watch.lost_nodes)
        data = {
            "job_id": self.spec.job_id,
            "state": state,
            "started": self.started,
            "updated": time.time(),
            "nodes": per_node,
            "lost": lost,
            "pid": os.getpid(),
        }
        if outcome is not None:
            data["outcome"] = asdict(outcome)
        self.run_dir.write_json("state.json", data)
