"""Run locks on the nodes: one per shared home and one per machine, held for a whole run, so
no two nodeprep runs ever write the same file or venv at once.

A lock is a directory made with `mkdir` (atomic on local file systems and on NFS, unlike
flock) holding an `owner` file: controller host, pid, start time and run id. A second run
waits (polling) up to `settings.lock_wait` seconds and then names the holder. A lock whose
holder is gone (same controller host, pid not running) or that is older than
`settings.lock_stale` is taken over, and the run says so. The locks of one run are taken all
or nothing (a run that cannot get one releases the others and tries again), so two runs that
want the same locks in a different order cannot wait on each other forever."""

from __future__ import annotations

import os
import random
import shlex
import socket
import time
from dataclasses import dataclass

from nodeprep.engine.remote import RUN_VAR, rpath, stop_tagged_script
from nodeprep.errors import NodeprepError


@dataclass(frozen=True)
class Owner:
    host: str
    pid: int
    start: float
    run: str

    def line(self) -> str:
        return f"{self.host} {self.pid} {self.start:.0f} {self.run}"

    @classmethod
    def parse(cls, text: str) -> "Owner | None":
        f = text.split()
        try:
            return cls(f[0], int(f[1]), float(f[2]), f[3])
        except (IndexError, ValueError):
            return None

    @classmethod
    def me(cls, run: str) -> "Owner":
        return cls(socket.gethostname(), os.getpid(), time.time(), run)

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.start))
        return f"host {self.host} pid {self.pid} since {when} (run {self.run})"


@dataclass(frozen=True)
class Lock:
    """PATH on the node SESSION reaches; WHAT names it for the user (`home of worker-[0-3]`)."""

    node: str
    path: str
    what: str


def _try_script(path: str, owner: Owner) -> str:
    """ACQUIRED; or HELD, the holder's owner line, the lock's mtime and the node's clock; or
    FAILED and why the lock could not be made at all (a read-only or full file system, a
    directory the user may not write): no holder to wait for. A lock released between a failed
    mkdir and the look at it (its holder let go just then) is tried again, up to 3 times."""
    p = rpath(path)
    return (
        f'mkdir -p "$(dirname {p})" 2>/dev/null; '
        "for _try in 1 2 3; do "
        f"if e=$(LC_ALL=C mkdir {p} 2>&1); then "
        f'if printf "%s\\n" {shlex.quote(owner.line())} > {p}/owner 2>/dev/null; '
        "then echo ACQUIRED; "
        f'else rm -rf {p}; echo "FAILED cannot write {path}/owner (no space left?)"; fi; break; '
        f"elif [ -d {p} ]; then echo HELD; cat {p}/owner 2>/dev/null; "
        f"echo; stat -c %Y {p} 2>/dev/null; date +%s; break; "
        # EEXIST and no directory: let go just now (or a file is in the way: said at try 3)
        """elif [ "$_try" != 3 ] && case "$e" in *"File exists"*) true;; *) false;; esac; """
        "then continue; "
        'else echo "FAILED $e"; break; fi; done'
    )


def _takeover_script(path: str, owner: Owner, old: str, mtime: str) -> str:
    """Replace the stale lock with ours and stop what the dead run left running on this node
    (its commands carry its run id). Takeovers of one lock are serialised by a second mkdir
    lock (PATH.takeover; one left by a takeover that died goes after 60 s), and inside it the
    lock must still be the stale one seen (owner line OLD, directory mtime MTIME): a lock a
    live run made meanwhile is never taken."""
    held = Owner.parse(old)
    stop = f"( {stop_tagged_script(RUN_VAR, held.run)} ) >/dev/null 2>&1; " if held else ""
    return (
        f"p={rpath(path)}; m={rpath(path + '.takeover')}; "
        'now=$(date +%s); t=$(stat -c %Y "$m" 2>/dev/null) && '
        '[ $((now - t)) -gt 60 ] && rmdir "$m"; '
        'mkdir "$m" 2>/dev/null || exit 3; trap \'rmdir "$m"\' EXIT; '
        f'[ "$(head -n 1 "$p/owner" 2>/dev/null)" = {shlex.quote(old)} ] || exit 3; '
        f'[ "$(stat -c %Y "$p" 2>/dev/null)" = {shlex.quote(mtime)} ] || exit 3; '
        'rm -rf "$p" && mkdir "$p" || exit 3; '
        f'printf "%s\\n" {shlex.quote(owner.line())} > "$p/owner"; ' + stop + "true"
    )


def release_script(path: str, owner: Owner) -> str:
    p = rpath(path)
    return (
        f'[ "$(head -n 1 {p}/owner 2>/dev/null)" = {shlex.quote(owner.line())} ] && '
        f"rm -rf {p}; true"
    )


def _alive_here(owner: Owner) -> bool:
    if owner.host != socket.gethostname():
        return True  # another controller: only its age can tell
    try:
        os.kill(owner.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# The runs of THIS process that have released their locks: a lock one of them still holds on a
# node was left there because the node could not be reached to release it (it had gone
# silent), and is taken over like a dead process's.
ENDED_RUNS: set[str] = set()


def stale(owner: Owner | None, lock_age: float, max_age: float) -> str | None:
    """Why the holder no longer counts (None: it does)."""
    if owner is None:
        # mkdir done, owner not written yet: a live contender for a moment, a dead one after
        return f"no owner recorded for {lock_age:.0f}s" if lock_age > 60 else None
    if not _alive_here(owner):
        return f"its holder ({owner.describe()}) is gone"
    if owner.host == socket.gethostname() and owner.pid == os.getpid() and owner.run in ENDED_RUNS:
        return f"its holder, an earlier run of this process ({owner.run}), has ended"
    if time.time() - owner.start > max_age:
        return f"its holder ({owner.describe()}) started more than {max_age:.0f}s ago"
    return None


def try_lock(session, lock: Lock, owner: Owner, max_age: float) -> Owner | None | str:
    """Take LOCK once: None when taken, or the holder that keeps it (an Owner, or the raw
    text when it cannot be read); a stale lock is taken over (noted on the session)."""
    r = session.run(_try_script(lock.path, owner), timeout=30, label=f"lock {lock.what}")
    lines = r.stdout.splitlines()
    if r.rc != 0 or not lines:
        raise NodeprepError(f"cannot lock {lock.path} on {lock.node}: {r.tail(2) or 'no answer'}")
    if lines[0] == "ACQUIRED":
        return None
    if lines[0].startswith("FAILED"):
        raise NodeprepError(
            f"cannot make the lock {lock.path} on {lock.node}: {lines[0][7:].strip()}",
            hint="the home must be writable, with room for a directory",
        )
    text = lines[1] if len(lines) > 1 else ""
    holder = Owner.parse(text)
    if holder is not None and holder.run == owner.run:
        return None
    nums = [ln for ln in lines[2:] if ln.strip().isdigit()]
    age = float(nums[-1]) - float(nums[-2]) if len(nums) >= 2 else 0.0
    why = stale(holder, age, max_age)
    mtime = nums[-2] if len(nums) >= 2 else ""
    if (
        why
        and mtime
        and session.run(
            _takeover_script(lock.path, owner, text, mtime),
            timeout=30,
            label=f"take over lock {lock.what}",
        ).rc
        == 0
    ):
        session.events.note(
            session.name, f"took over the lock of the {lock.what} ({lock.path}): {why}"
        )
        return None
    return holder or text or "an unknown holder"


def _rank(owner: Owner) -> tuple[int, str]:
    return round(owner.start), owner.run  # as the owner line records it: whole seconds


class Locks:
    """The locks of one run: acquire() waits up to WAIT seconds for all of them (wait-die: see
    _outranks) and holds none when it gives up."""

    def __init__(self, fleet, locks: list[Lock], owner: Owner):
        self.fleet = fleet
        self.locks = locks
        self.owner = owner
        self.held: list[Lock] = []

    def _round(self, max_age: float) -> dict[Lock, object]:
        by_node: dict[str, list[Lock]] = {}
        for lk in self.locks:
            if lk not in self.held:
                by_node.setdefault(lk.node, []).append(lk)
        got = self.fleet.map(
            lambda s: [(lk, try_lock(s, lk, self.owner, max_age)) for lk in by_node[s.name]],
            "lock",
            only=list(by_node),
        )
        busy = {}
        for pairs in got.values():
            for lk, holder in pairs:
                if holder is None:
                    self.held.append(lk)
                else:
                    busy[lk] = holder
        return busy

    def acquire(self, wait: float, max_age: float) -> bool:
        """True when another run held one of the locks first (what it changed is not in the
        facts read before: read them again)."""
        deadline, said = time.monotonic() + wait, False
        while True:
            busy = self._round(max_age)
            if not busy:
                return said
            if not self._outranks(busy.values()):
                self._unlock()  # a younger run never holds some locks while it waits for others
            if not said:
                lk, holder = next(iter(busy.items()))
                who = holder.describe() if isinstance(holder, Owner) else str(holder)
                self.fleet.events.log(
                    f"waiting up to {wait:.0f}s for the {lk.what}: locked by {who}"
                )
                said = True
            if time.monotonic() >= deadline:
                self._unlock()
                lk, holder = next(iter(busy.items()))
                who = holder.describe() if isinstance(holder, Owner) else str(holder)
                raise NodeprepError(
                    f"the {lk.what} is locked by another nodeprep run: {who}; "
                    f"waited {wait:.0f}s ({lk.path} on {lk.node})",
                    hint="wait for that run, or remove the lock directory if you know it is dead",
                )
            time.sleep(min(1.0 + random.random(), max(0.0, deadline - time.monotonic())))

    def _outranks(self, holders) -> bool:
        """Wait-die: the older run (earlier start, then smaller run id) keeps the locks it has and
        waits for the rest; a younger one lets all of its locks go. Two runs wanting the same locks
        in opposite order then never take turns failing: the older always gets them."""
        mine = _rank(self.owner)
        return all(isinstance(h, Owner) and _rank(h) > mine for h in holders)

    def release(self) -> None:
        """The run is done with its locks: released (where the nodes answer), the run ended."""
        ENDED_RUNS.add(self.owner.run)
        self._unlock()

    def _unlock(self) -> None:
        held, self.held = self.held, []
        by_node: dict[str, list[Lock]] = {}
        for lk in held:
            by_node.setdefault(lk.node, []).append(lk)
        if by_node:
            # failed nodes too: a step that failed after the lock was taken must not keep it
            self.fleet.cleanup(
                lambda s: [
                    s.run(
                        release_script(lk.path, self.owner), timeout=30, label=f"unlock {lk.what}"
                    )
                    for lk in by_node[s.name]
                ],
                "unlock",
                only=list(by_node),
            )
