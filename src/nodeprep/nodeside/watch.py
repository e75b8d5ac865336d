"""nodeprep's rank watch: one per machine for the length of a job, started by the controller
over ssh. Standalone (stdlib only). Usage: python watch.py JOB [--interval S] [--launcher L]...

Every INTERVAL seconds it prints ONE JSON line (a tick, also the node's heartbeat):
  {"t": <node time>, "ev": [...]}
with events for what changed since the last tick, for this machine's ranks only (the
records rank.py writes carry a machine key; a shared home holds other machines' too):
  {"k": "start", ...start record}      a rank (attempt) started
  {"k": "exit", ...exit record}        a rank ended: rc (negative: signal), oom
  {"k": "vanished", "rank", "attempt", "end"}   its wrapper disappeared without a record
  {"k": "line", "src": "r3.out" | "r3.err" | "r3.stack" | "L:<label>", "text"}  output
  {"k": "beat", "rank", "t"}           the rank touched $NODEPREP_HEARTBEAT
  {"k": "launcher", "label", "rc"}     a launcher command this node started has ended
It exits when the run directory holds `watch.stop`, or when the controller's ssh session
goes away (its parent changes). Between ticks it looks every 50 ms for a new rank record, a
launcher's end or the stop, and ticks at once when one appears.
"""

import json
import os
import sys
import time

# rank.py lies beside this file (~/.nodeprep/agent): the same key the rank records carry
from rank import machine_key, run_dir

STOP = "watch.stop"  # in the run directory: the controller says end
MAX_LINES = 400  # per file per tick: a chatty rank cannot starve the heartbeat
MAX_LINE = 4000  # characters kept of one line


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (OSError, IndexError):
        return False


class Tail:
    """Complete lines appended to a file since the last read (a partial last line waits
    until its newline, or is flushed after 2 s of silence)."""

    def __init__(self, path):
        self.path = path
        self.pos = 0
        self.buf = b""
        self.since = None

    def lines(self, final=False):
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                data = f.read(MAX_LINES * 512)
                self.pos = f.tell()
        except OSError:
            data = b""
        self.buf += data
        *full, self.buf = self.buf.split(b"\n")
        now = time.monotonic()
        if self.buf and (final or (self.since is not None and now - self.since > 2)):
            full.append(self.buf)
            self.buf = b""
        self.since = now if self.buf and data else (self.since if self.buf else None)
        return [ln.decode("utf-8", "replace").rstrip("\r")[:MAX_LINE] for ln in full]


class Watch:
    def __init__(self, job, launchers):
        self.dir = run_dir(job)
        self.ranks_dir = os.path.join(self.dir, "ranks")
        self.key = machine_key()
        self.launchers = launchers
        self.seen = {}  # record file -> True once reported (or not ours)
        self.running = {}  # (rank, attempt) -> start record
        self.gone = {}  # (rank, attempt) -> monotonic time its wrapper was seen gone
        self.tails = {}
        self.beats = {}
        self.ended = set()

    def _records(self, ev):
        try:
            names = sorted(os.listdir(self.ranks_dir))
        except OSError:
            return
        for name in names:
            if name in self.seen or not (name.endswith(".start") or name.endswith(".exit")):
                continue
            rec = read_json(os.path.join(self.ranks_dir, name))
            if rec is None:
                continue  # being written: next tick
            key = (rec.get("rank"), rec.get("attempt"))
            if name.endswith(".start"):
                self.seen[name] = True
                if rec.get("machine") != self.key:
                    continue
                self.running[key] = rec
                r = rec["rank"]
                for ext in ("out", "err", "stack"):
                    self.tails.setdefault(
                        f"r{r}.{ext}", Tail(os.path.join(self.dir, f"rank-{r}.{ext}"))
                    )
                ev.append(dict(rec, k="start"))
            elif key in self.running:
                self.seen[name] = True
                del self.running[key]
                self.gone.pop(key, None)
                ev.append(dict(rec, k="exit"))

    def _vanished(self, ev):
        now = time.monotonic()
        for key, rec in list(self.running.items()):
            if alive(rec["pid"]):
                continue
            first = self.gone.setdefault(key, now)
            if now - first > 1.0:  # its .exit record did not follow: killed
                del self.running[key]
                ev.append(
                    {
                        "k": "vanished",
                        "rank": key[0],
                        "attempt": key[1],
                        "end": time.time(),
                        "child_alive": alive(rec.get("child", 0)),
                    }
                )

    def _outputs(self, ev, final=False):
        for label in self.launchers:
            self.tails.setdefault(
                f"L:{label}", Tail(os.path.join(self.dir, f"launcher-{label}.out"))
            )
        for src, tail in self.tails.items():
            for text in tail.lines(final):
                ev.append({"k": "line", "src": src, "text": text})

    def _beats(self, ev):
        for rec in self.running.values():
            r = rec["rank"]
            try:
                t = os.stat(os.path.join(self.dir, f"rank-{r}.beat")).st_mtime
            except OSError:
                continue
            if self.beats.get(r) != t:
                self.beats[r] = t
                ev.append({"k": "beat", "rank": r, "t": t})

    def _launchers(self, ev):
        for label in self.launchers:
            if label in self.ended:
                continue
            try:
                with open(os.path.join(self.dir, f"launcher-{label}.rc")) as f:
                    rc = int(f.read().strip() or "255")
            except (OSError, ValueError):
                continue
            self.ended.add(label)
            ev.append({"k": "launcher", "label": label, "rc": rc, "end": time.time()})

    def marker(self):
        """What changes when a tick has news the controller is waiting on: a rank record
        written (the ranks directory's mtime), a launcher's end, the controller's stop."""
        try:
            ranks = os.stat(self.ranks_dir).st_mtime_ns
        except OSError:
            ranks = None
        ends = [
            os.path.exists(os.path.join(self.dir, f"launcher-{label}.rc"))
            for label in self.launchers
            if label not in self.ended
        ]
        return ranks, os.path.exists(os.path.join(self.dir, STOP)), ends

    def nap(self, seconds, mark, step=0.05):
        """Sleep up to SECONDS, but wake within STEP when marker() is no longer MARK (taken
        before the last tick looked): an exit or a stop reaches the controller at once, not at
        the next tick."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(min(step, max(0.0, end - time.monotonic())))
            if self.marker() != mark:
                return

    def tick(self, final=False):
        ev = []
        self._records(ev)
        self._outputs(ev, final)
        self._vanished(ev)
        self._beats(ev)
        self._launchers(ev)
        return ev


def main(argv):
    job = argv[0]
    interval = 0.25
    launchers = []
    rest = argv[1:]
    while rest:
        opt = rest[0]
        val = rest[1]
        rest = rest[2:]
        if opt == "--interval":
            interval = float(val)
        elif opt == "--launcher":
            launchers.append(val)
    w = Watch(job, launchers)
    # its ssh session's end ends it (the parent changes); in a job container the parent is
    # outside its pid namespace (0) and its adoption by the container's init is no such sign:
    # there the STOP file and the container's removal end it
    parent = os.getppid()
    out = sys.stdout
    while True:
        mark = w.marker()
        stop = os.path.exists(os.path.join(w.dir, STOP)) or (parent != 0 and os.getppid() != parent)
        ev = w.tick(final=stop)
        try:
            out.write(json.dumps({"t": time.time(), "ev": ev, "end": stop}) + "\n")
            out.flush()
        except (BrokenPipeError, OSError):
            return 0
        if stop:
            return 0
        w.nap(interval, mark)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
