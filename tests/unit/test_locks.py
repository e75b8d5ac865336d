"""Run locks (engine/locks.py) for real, without ssh: the lock scripts run under /bin/sh on this
machine, with HOME in a temporary directory so `~/.nodeprep/lock` lands there."""

import os
import shutil
import socket
import subprocess
import threading
import time
import uuid

import pytest

from nodeprep.engine.locks import Lock, Locks, Owner, release_script, stale, try_lock
from nodeprep.errors import NodeprepError

HOME_LOCK = "~/.nodeprep/lock"
HOST = socket.gethostname()


class Result:
    def __init__(self, rc: int, stdout: str, stderr: str):
        self.rc, self.stdout, self.stderr = rc, stdout, stderr

    def tail(self, lines: int = 12) -> str:
        text = (self.stderr.strip() or self.stdout.strip()).splitlines()
        return "\n".join(text[-lines:])


class Display:
    def __init__(self):
        self.notes: list[tuple[str, str]] = []
        self.logs: list[str] = []

    def note(self, node, text):
        self.notes.append((node, text))

    def log(self, text):
        self.logs.append(text)

    def status(self, *_a, **_k):
        pass


class Session:
    """A node that is this machine: every script runs under /bin/sh here."""

    def __init__(self, name: str, display: Display, env: dict | None = None):
        self.name, self.events, self.env = name, display, env
        self.labels: list[str] = []

    def run(self, script, timeout=None, label=None, **_kw):
        self.labels.append(label or "")
        p = subprocess.run(
            ["/bin/sh", "-c", script],
            capture_output=True,
            text=True,
            timeout=timeout or 60,
            env=self.env,
        )
        return Result(p.returncode, p.stdout, p.stderr)


class Fleet:
    def __init__(self, *names: str):
        self.events = Display()
        self.sessions = {n: Session(n, self.events) for n in names}
        self.run_id = "fake-fleet"

    def map(self, fn, stage, only=None):
        return {n: fn(s) for n, s in self.sessions.items() if only is None or n in only}

    def cleanup(self, fn, stage, only=None):
        self.map(fn, stage, only)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def _run_id(what: str) -> str:
    return f"test-{what}-{uuid.uuid4().hex[:8]}"


def _hold(path, owner: Owner | None):
    """A lock left by someone else: the directory, and its owner file unless OWNER is None."""
    path.mkdir(parents=True)
    if owner is not None:
        (path / "owner").write_text(owner.line() + "\n")


def _dead_pid() -> int:
    p = subprocess.Popen(["/bin/true"])
    p.wait()
    return p.pid


# -- Owner and stale -------------------------------------------------------------------------


def test_owner_line_roundtrip():
    o = Owner("ctl-1", 4242, 1700000000.4, "20240101-120000-provision-4242")
    assert o.line() == "ctl-1 4242 1700000000 20240101-120000-provision-4242"
    assert Owner.parse(o.line()) == Owner("ctl-1", 4242, 1700000000.0, o.run)
    assert Owner.parse("") is None
    assert Owner.parse("ctl-1 notapid 1700000000 r") is None
    assert Owner.parse("ctl-1 4242 1700000000") is None
    me = Owner.me("r1")
    assert (me.host, me.pid, me.run) == (HOST, os.getpid(), "r1")
    assert abs(me.start - time.time()) < 5


def test_stale_rules():
    now = time.time()
    assert stale(Owner(HOST, os.getpid(), now, "r"), 0, 3600) is None  # alive, young
    gone = stale(Owner(HOST, _dead_pid(), now, "r"), 0, 3600)
    assert gone and "is gone" in gone
    old = stale(Owner(HOST, os.getpid(), now - 7200, "r"), 0, 3600)
    assert old and "started more than 3600s ago" in old
    # another controller's pid cannot be checked from here: only its age counts
    assert stale(Owner("some-other-controller", _dead_pid(), now, "r"), 0, 3600) is None
    assert stale(Owner("some-other-controller", 1, now - 7200, "r"), 0, 3600)
    # a lock directory without an owner file: a contender between mkdir and write for a
    # moment (not stale), a dead one after a minute
    assert stale(None, 0, 3600) is None
    assert stale(None, 59, 3600) is None
    assert stale(None, 61, 3600) == "no owner recorded for 61s"


# -- 1. free lock: taken with the owner line, released only by its owner ----------------------


def test_free_lock_is_taken_with_owner_line(home):
    fleet = Fleet("worker-0")
    me = Owner.me(_run_id("a"))
    lk = Lock("worker-0", HOME_LOCK, "home of worker-0")
    locks = Locks(fleet, [lk], me)
    locks.acquire(wait=0, max_age=3600)
    d = home / ".nodeprep" / "lock"
    assert d.is_dir()
    assert (d / "owner").read_text() == me.line() + "\n"
    assert locks.held == [lk]
    assert fleet.events.notes == []
    locks.release()
    assert not d.exists()
    assert locks.held == []
    locks.release()  # nothing held: nothing to do
    assert not d.exists()


def test_try_lock_on_free_absolute_path_creates_parent(home):
    s = Session("worker-0", Display())
    path = home / "deep" / "er" / "m.lock"
    me = Owner.me(_run_id("abs"))
    assert try_lock(s, Lock("worker-0", str(path), "machine of worker-0"), me, 3600) is None
    assert (path / "owner").read_text() == me.line() + "\n"


def test_try_lock_again_in_the_same_run_is_ours(home):
    s = Session("worker-0", Display())
    me = Owner.me(_run_id("same"))
    lk = Lock("worker-0", HOME_LOCK, "home of worker-0")
    assert try_lock(s, lk, me, 3600) is None
    assert try_lock(s, lk, me, 3600) is None
    assert (home / ".nodeprep/lock/owner").read_text() == me.line() + "\n"


def test_release_leaves_another_owners_lock_alone(home):
    s = Session("worker-0", Display())
    d = home / ".nodeprep" / "lock"
    holder = Owner(HOST, os.getpid(), time.time(), _run_id("holder"))
    _hold(d, holder)
    others = [
        Owner(HOST, os.getpid(), holder.start, _run_id("other")),  # other run
        Owner(HOST, os.getpid() + 1, holder.start, holder.run),  # other pid
        Owner("other-host", os.getpid(), holder.start, holder.run),
    ]  # other host
    for other in others:
        assert s.run(release_script(HOME_LOCK, other)).rc == 0
        assert (d / "owner").read_text() == holder.line() + "\n"
    # a Locks object of another run that believes it holds the lock does not remove it either
    lk = Lock("worker-0", HOME_LOCK, "home of worker-0")
    fleet = Fleet("worker-0")
    theirs = Locks(fleet, [lk], others[0])
    theirs.held = [lk]
    theirs.release()
    assert (d / "owner").read_text() == holder.line() + "\n"
    assert s.run(release_script(HOME_LOCK, holder)).rc == 0
    assert not d.exists()


def test_release_of_a_lock_that_is_gone_is_fine(home):
    s = Session("worker-0", Display())
    r = s.run(release_script(HOME_LOCK, Owner.me("r")))
    assert r.rc == 0


# -- 2. a live holder blocks; all or nothing ----------------------------------------------------


def test_live_holder_blocks_and_is_named(home):
    holder = Owner(HOST, os.getpid(), time.time(), _run_id("holder"))
    busy_path = home / "machine" / "m.lock"
    _hold(busy_path, holder)
    fleet = Fleet("worker-0", "worker-1")
    free = Lock("worker-0", HOME_LOCK, "home of worker-[0-1]")
    busy = Lock("worker-1", str(busy_path), "machine of worker-1")
    locks = Locks(fleet, [free, busy], Owner.me(_run_id("me")))
    t0 = time.monotonic()
    with pytest.raises(NodeprepError) as e:
        locks.acquire(wait=1.5, max_age=3600)
    took = time.monotonic() - t0
    assert 1.4 <= took < 5
    msg = str(e.value)
    assert f"host {holder.host} pid {holder.pid}" in msg
    assert holder.run in msg and "machine of worker-1" in msg and str(busy_path) in msg
    # all or nothing: the free lock, taken in the same round, was given back
    assert "unlock home of worker-[0-1]" in fleet.sessions["worker-0"].labels
    assert not (home / ".nodeprep" / "lock").exists()
    assert locks.held == []
    # the holder's lock is untouched, nothing was taken over
    assert (busy_path / "owner").read_text() == holder.line() + "\n"
    assert fleet.events.notes == []


def test_holder_on_another_controller_is_never_probed_by_pid(home):
    holder = Owner("some-other-controller", _dead_pid(), time.time(), _run_id("remote"))
    _hold(home / ".nodeprep" / "lock", holder)
    s = Session("worker-0", Display())
    got = try_lock(
        s, Lock("worker-0", HOME_LOCK, "home of worker-0"), Owner.me(_run_id("me")), 3600
    )
    assert got == Owner(holder.host, holder.pid, float(f"{holder.start:.0f}"), holder.run)
    assert (home / ".nodeprep/lock/owner").read_text() == holder.line() + "\n"
    assert s.events.notes == []


# -- 3. stale locks are taken over --------------------------------------------------------------


def test_lock_of_a_dead_holder_is_taken_over(home):
    holder = Owner(HOST, _dead_pid(), time.time(), _run_id("dead"))
    d = home / ".nodeprep" / "lock"
    _hold(d, holder)
    fleet = Fleet("worker-0")
    me = Owner.me(_run_id("me"))
    locks = Locks(fleet, [Lock("worker-0", HOME_LOCK, "home of worker-0")], me)
    locks.acquire(wait=0, max_age=3600)
    assert (d / "owner").read_text() == me.line() + "\n"
    [(node, text)] = fleet.events.notes
    assert node == "worker-0"
    assert text.startswith("took over the lock of the home of worker-0 (~/.nodeprep/lock): ")
    assert f"pid {holder.pid}" in text and "is gone" in text
    assert [p.name for p in d.parent.iterdir()] == ["lock"]  # no .stale.* left
    locks.release()
    assert not d.exists()


def test_lock_older_than_max_age_is_taken_over(home):
    holder = Owner(HOST, os.getpid(), time.time() - 7200, _run_id("old"))  # alive, but old
    d = home / ".nodeprep" / "lock"
    _hold(d, holder)
    s = Session("worker-0", Display())
    lk = Lock("worker-0", HOME_LOCK, "home of worker-0")
    me = Owner.me(_run_id("me"))
    assert try_lock(s, lk, me, max_age=3 * 3600) is not None  # young enough yet
    assert (d / "owner").read_text() == holder.line() + "\n"
    assert try_lock(s, lk, me, max_age=3600) is None
    assert (d / "owner").read_text() == me.line() + "\n"
    [(_, text)] = s.events.notes
    assert "started more than 3600s ago" in text


def test_lock_without_owner_file_is_stale_only_after_a_minute(home):
    d = home / ".nodeprep" / "lock"
    _hold(d, None)
    s = Session("worker-0", Display())
    lk = Lock("worker-0", HOME_LOCK, "home of worker-0")
    me = Owner.me(_run_id("me"))
    assert try_lock(s, lk, me, 3600) == "an unknown holder"  # young: a contender writing
    assert not (d / "owner").exists()
    assert s.events.notes == []
    past = time.time() - 120
    os.utime(d, (past, past))
    assert try_lock(s, lk, me, 3600) is None
    assert (d / "owner").read_text() == me.line() + "\n"
    [(_, text)] = s.events.notes
    assert "no owner recorded for" in text


def test_two_takeovers_of_one_stale_lock_only_one_wins(home):
    """Two runs find the same stale lock at once. B checks the owner, then is slow to `mv`
    (a busy NFS server; here a `mv` that sleeps first); meanwhile A takes the lock over.
    B's late `mv` must not move A's new lock aside: only one of them may hold it."""
    holder = Owner(HOST, _dead_pid(), time.time(), _run_id("dead"))
    d = home / ".nodeprep" / "lock"
    _hold(d, holder)
    slow = home / "slowbin"
    slow.mkdir()
    (slow / "mv").write_text(f'#!/bin/sh\nsleep 0.8\nexec {shutil.which("mv")} "$@"\n')
    (slow / "mv").chmod(0o755)
    lk = Lock("worker-0", HOME_LOCK, "home of worker-0")
    a, b = Owner.me(_run_id("a")), Owner.me(_run_id("b"))
    sa = Session("worker-0", Display())
    sb = Session("worker-0", Display(), env=dict(os.environ, PATH=f"{slow}:{os.environ['PATH']}"))
    got = {}
    t = threading.Thread(target=lambda: got.update(b=try_lock(sb, lk, b, 3600)))
    t.start()
    time.sleep(0.4)  # B has seen the stale owner and is in its slow mv
    got["a"] = try_lock(sa, lk, a, 3600)
    t.join(timeout=10)
    assert not t.is_alive()
    winners = [o for o, r in ((a, got["a"]), (b, got["b"])) if r is None]
    assert len(winners) == 1, f"both runs believe they hold {d}"
    assert (d / "owner").read_text() == winners[0].line() + "\n"


# -- 4. two runs racing on the same lock ---------------------------------------------------------


def _contender(locks_of, tag, barrier, events, guard, errors, hold_s, home):
    # each run has its own fleet, reaching the nodes in the order of its locks
    fleet = Fleet(*dict.fromkeys(lk.node for lk in locks_of))
    locks = Locks(fleet, locks_of, Owner.me(_run_id(tag)))
    try:
        barrier.wait(timeout=5)
        locks.acquire(wait=8, max_age=3600)
        with guard:
            events.append(("in", tag, time.monotonic()))
        for lk in locks_of:  # while we hold them, every lock records us
            p = lk.path.replace("~", str(home), 1)
            assert open(os.path.join(p, "owner")).read() == locks.owner.line() + "\n"
        time.sleep(hold_s)
        with guard:
            events.append(("out", tag, time.monotonic()))
        locks.release()
    except BaseException as e:  # reported by the main thread
        errors.append(e)


def _race(home, locks_a, locks_b, hold_s):
    barrier, guard = threading.Barrier(2), threading.Lock()
    events, errors = [], []
    threads = [
        threading.Thread(
            target=_contender, args=(lks, tag, barrier, events, guard, errors, hold_s, home)
        )
        for tag, lks in (("a", locks_a), ("b", locks_b))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors
    order = [(kind, tag) for kind, tag, _t in events]
    first, second = order[0][1], order[2][1]
    assert order == [("in", first), ("out", first), ("in", second), ("out", second)]
    assert first != second
    assert events[2][2] >= events[1][2]  # the second got in only after the first left


def test_two_runs_on_one_lock_take_turns(home):
    lk = Lock("worker-0", HOME_LOCK, "home of worker-0")
    _race(home, [lk], [lk], hold_s=1.0)
    assert not (home / ".nodeprep" / "lock").exists()


def test_two_runs_wanting_two_locks_in_opposite_order_both_finish(home):
    a = Lock("worker-0", HOME_LOCK, "home of worker-[0-1]")
    b = Lock("worker-1", str(home / "machine.lock"), "machine of worker-1")
    _race(home, [a, b], [b, a], hold_s=0.3)
    assert not (home / ".nodeprep" / "lock").exists()
    assert not (home / "machine.lock").exists()


def test_a_lock_left_by_an_ended_run_of_this_process_is_stale():
    """A run that could not release a lock (its node had gone silent) ended; the same process's
    next run takes the lock over when the node is back, instead of waiting for itself."""
    from nodeprep.engine import locks

    run = _run_id("ended")
    mine = Owner(HOST, os.getpid(), time.time(), run)
    assert stale(mine, 0, 3600) is None  # a live run of this process
    locks.ENDED_RUNS.add(run)
    try:
        assert "an earlier run of this process" in stale(mine, 0, 3600)
    finally:
        locks.ENDED_RUNS.discard(run)


def test_the_older_run_keeps_its_locks_and_a_younger_one_lets_go():
    """Wait-die decides who waits holding: only a run older than every holder in its way."""
    from nodeprep.engine.locks import Locks

    old, young = Owner(HOST, 1, 1000.0, "run-b"), Owner(HOST, 2, 1001.0, "run-a")
    tie = Owner(HOST, 3, 1000.4, "run-c")  # the same whole second as OLD: the run id decides
    assert Locks(None, [], old)._outranks([young, tie])
    assert not Locks(None, [], young)._outranks([old])
    assert not Locks(None, [], tie)._outranks([old])
    assert not Locks(None, [], old)._outranks(["an unknown holder"])  # no age to compare: let go


def test_a_lock_let_go_between_the_mkdir_and_the_look_is_tried_again(home):
    """CI saw it (test_shapes, two provisions at once): mkdir failed with EEXIST, then the
    holder released, so no directory was there to read and the run gave up with 'cannot make
    the lock'. Here `mkdir` says EEXIST once without making anything (the lock was let go just
    then): the next try takes the lock."""
    fake = home / "racebin"
    fake.mkdir()
    flag = home / "raced"
    (fake / "mkdir").write_text(
        "#!/bin/sh\n"
        f'if [ "$1" != -p ] && [ ! -e {flag} ]; then : > {flag}; '
        "echo \"mkdir: cannot create directory '$1': File exists\" >&2; exit 1; fi\n"
        f'exec {shutil.which("mkdir")} "$@"\n'
    )
    (fake / "mkdir").chmod(0o755)
    s = Session("worker-0", Display(), env=dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}"))
    me = Owner.me(_run_id("race"))
    assert try_lock(s, Lock("worker-0", HOME_LOCK, "home of worker-0"), me, 3600) is None
    assert flag.exists()  # the race happened
    assert (home / ".nodeprep" / "lock" / "owner").read_text() == me.line() + "\n"


def test_a_file_where_the_lock_goes_is_named_not_waited_for(home):
    (home / ".nodeprep").mkdir()
    (home / ".nodeprep" / "lock").write_text("not a lock\n")
    s = Session("worker-0", Display())
    with pytest.raises(NodeprepError, match="cannot make the lock .*File exists"):
        try_lock(s, Lock("worker-0", HOME_LOCK, "home of worker-0"), Owner.me(_run_id("f")), 3600)
