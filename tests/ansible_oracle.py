"""The reference `ansible-inventory`, imported once and forked per run: a test helper.

Importing Ansible is nearly all of an `ansible-inventory --list` run (about 1 s of CPU each).
A server, started once per test process with the interpreter named in the console script's
`#!` line and the fixed environment of the oracle runs, runs the console script's imports once
(ansible.cli.inventory: Ansible reads its configuration there), then for each request forks a
child that does what a fresh process would do from that point on:

  - stdin is /dev/null, stdout and stderr are files of the request, no other descriptor is open;
  - the working directory is the request's;
  - the controller temporary directory is the child's own (Ansible makes one per process at
    import, named after the pid, and removes it at exit);
  - sys.argv is the request's argv, and the console script runs as __main__ (runpy), so its
    `sys.exit(main())` and the interpreter's own exit (flushing, atexit) give the exit code.

What a child cannot change is what the interpreter fixed at its start: the hash seed is the
server's for every run (the corpus's output does not depend on it), and so is sys.path. The
objects of the import are frozen out of the garbage collector (gc.freeze) before the first fork.
tests/unit/test_ansible_oracle.py holds the forked runs equal, byte for byte, to real
subprocesses.

Requests and answers are JSON lines on two pipes (the descriptor numbers are the server's
arguments): {"id", "argv", "cwd", "stdout", "stderr", "timeout"} and {"id", "rc", "timed_out"};
the first answer is {"ready": pid}. The server exits when the request pipe closes and its last
child has ended. Oracle is the client, safe to call from several threads at once.
"""

from __future__ import annotations

import atexit
import gc
import io
import itertools
import json
import os
import runpy
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

STARTUP_TIMEOUT = 120


# -- the server (runs under the reference Ansible's interpreter) -------------------------------


def _fresh_local_tmp() -> None:
    """The controller temporary directory a fresh process would make (DEFAULT_LOCAL_TMP, a
    `tmppath` setting: made at import, removed at exit), in place of the server's."""
    from ansible import constants as C
    from ansible.utils.path import cleanup_tmp_file

    atexit.unregister(cleanup_tmp_file)
    C.DEFAULT_LOCAL_TMP = C.config.get_config_value("DEFAULT_LOCAL_TMP", variables=vars(C))


def _child(req: dict, close: list[int]) -> None:
    """In the forked child: become the run REQ asks for; never returns (SystemExit)."""
    for fd in close:
        os.close(fd)
    files = [
        os.open(os.devnull, os.O_RDONLY),
        os.open(req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
        os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
    ]
    for target, fd in enumerate(files):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(req["cwd"])
    _fresh_local_tmp()
    sys.argv = list(req["argv"])
    runpy.run_path(sys.argv[0], run_name="__main__")
    raise SystemExit(0)  # a script that ends without sys.exit


def _answer(fd: int, msg: dict) -> None:
    os.write(fd, (json.dumps(msg) + "\n").encode())


def serve(script: str, req_fd: int, resp_fd: int) -> None:
    """Import SCRIPT's modules, then fork one child per request read from REQ_FD."""
    sys.path[0] = os.path.dirname(os.path.realpath(script))  # as `python SCRIPT` sets it
    runpy.run_path(script, run_name="ansible_oracle_warm")  # its imports; not its main block
    # the collector leaves the import's objects alone from here (its cyclic garbage is a few
    # cells and functions, no finalizer): a child's full collections then neither scan nor
    # copy their pages, half of a run's CPU
    gc.freeze()
    _answer(resp_fd, {"ready": os.getpid()})
    children: dict[int, dict] = {}  # pidfd -> {"pid", "id", "deadline", "timed_out"}
    buf, reading = b"", True
    while reading or children:
        deadlines = [c["deadline"] for c in children.values() if not c["timed_out"]]
        wait = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
        watched = ([req_fd] if reading else []) + list(children)
        ready, _, _ = select.select(watched, [], [], wait)
        for fd in ready:
            if fd != req_fd:
                c = children.pop(fd)
                status = os.waitpid(c["pid"], 0)[1]
                os.close(fd)
                rc = os.waitstatus_to_exitcode(status)
                _answer(resp_fd, {"id": c["id"], "rc": rc, "timed_out": c["timed_out"]})
                continue
            data = os.read(req_fd, 65536)
            reading, buf = bool(data), buf + data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                req = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    _child(req, [req_fd, resp_fd, *children])
                deadline = time.monotonic() + req["timeout"]
                entry = {"pid": pid, "id": req["id"], "deadline": deadline, "timed_out": False}
                children[os.pidfd_open(pid)] = entry
        for c in children.values():
            if not c["timed_out"] and time.monotonic() >= c["deadline"]:
                os.kill(c["pid"], signal.SIGKILL)
                c["timed_out"] = True


# -- the client --------------------------------------------------------------------------------


@dataclass
class Result:
    rc: int
    stdout: bytes
    stderr: bytes


def as_text(data: bytes) -> str:
    """DATA as subprocess.run(text=True) gives it: the locale's encoding, universal newlines."""
    return io.TextIOWrapper(io.BytesIO(data)).read()


def interpreter(script: Path) -> str:
    """The interpreter SCRIPT's `#!` line names (what the kernel runs it with)."""
    first = script.read_bytes().split(b"\n", 1)[0].decode()
    if not first.startswith("#!") or len(first[2:].split()) != 1:
        raise RuntimeError(f"{script}: not a `#!INTERPRETER` console script: {first!r}")
    return first[2:].strip()


class Oracle:
    """A running server for console script SCRIPT, started with environment ENV in the empty
    directory CWD, its own output going to LOG; run() is safe from several threads."""

    def __init__(self, script: Path, env: dict[str, str], cwd: Path, log: Path):
        self.log, self._out = log, Path(tempfile.mkdtemp(prefix="out-", dir=log.parent))
        req_r, self._req_w = os.pipe()
        resp_r, resp_w = os.pipe()
        with open(log, "wb") as out:
            self._proc = subprocess.Popen(
                [interpreter(script), __file__, str(script), str(req_r), str(resp_w)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                pass_fds=(req_r, resp_w),
            )
        os.close(req_r)
        os.close(resp_w)
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._pending: dict[int, Future] = {}
        self._gone: Exception | None = None
        ready: Future = Future()
        threading.Thread(target=self._read, args=(resp_r, ready), daemon=True).start()
        try:
            self.server_pid = ready.result(timeout=STARTUP_TIMEOUT)
            if log.stat().st_size:  # what the import printed, a fresh process prints each run
                raise RuntimeError(f"the oracle server printed while importing:\n{self.said()}")
        except BaseException:
            self.close()
            raise

    def said(self) -> str:
        return self.log.read_text(errors="replace")

    def _read(self, resp_r: int, ready: Future) -> None:
        with os.fdopen(resp_r, "rb") as answers:
            for line in answers:
                msg = json.loads(line)
                if "ready" in msg:
                    ready.set_result(msg["ready"])
                    continue
                with self._lock:
                    future = self._pending.pop(msg["id"])
                future.set_result(msg)
        rc = self._proc.wait()
        with self._lock:
            self._gone = RuntimeError(f"the oracle server ended (exit code {rc}):\n{self.said()}")
            pending, self._pending = [ready, *self._pending.values()], {}
        for future in pending:
            if not future.done():
                future.set_exception(self._gone)

    def run(self, argv: list[str], cwd: Path, timeout: float) -> Result:
        """ARGV (argv[0]: the server's script) run in CWD, as subprocess.run runs it with stdin
        /dev/null and both outputs captured; subprocess.TimeoutExpired past TIMEOUT seconds."""
        n = next(self._ids)
        out, err = self._out / f"{n}.stdout", self._out / f"{n}.stderr"
        req = {"id": n, "argv": argv, "cwd": str(cwd), "timeout": timeout}
        req.update(stdout=str(out), stderr=str(err))
        future: Future = Future()
        with self._lock:
            if self._gone:
                raise self._gone
            self._pending[n] = future
            os.write(self._req_w, (json.dumps(req) + "\n").encode())
        msg = future.result(timeout=timeout + STARTUP_TIMEOUT)  # the server kills at TIMEOUT
        try:
            if msg["timed_out"]:
                raise subprocess.TimeoutExpired(argv, timeout)
            return Result(msg["rc"], out.read_bytes(), err.read_bytes())
        finally:
            out.unlink(missing_ok=True)
            err.unlink(missing_ok=True)

    def close(self) -> None:
        """End the server once its runs have ended."""
        with self._lock:
            if self._req_w >= 0:
                os.close(self._req_w)
                self._req_w = -1
        try:
            self._proc.wait(timeout=STARTUP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def isolated_env(base: dict[str, str], home: Path) -> dict[str, str]:
    """BASE without ANSIBLE_*, with an empty config file and HOME as Ansible's home and local
    temp; unparsed sources fatal; only the script, yaml and ini inventory plugins; no colour."""
    env = {k: v for k, v in base.items() if not k.startswith("ANSIBLE_")}
    env.update(
        ANSIBLE_CONFIG=str(home / "ansible.cfg"),
        ANSIBLE_HOME=str(home),
        ANSIBLE_LOCAL_TEMP=str(home),
        ANSIBLE_INVENTORY_UNPARSED_FAILED="1",
        ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED="1",
        ANSIBLE_INVENTORY_ENABLED="script,yaml,ini",
        ANSIBLE_NOCOLOR="1",
    )
    return env


class Session:
    """A temporary home (HOME: its empty ansible.cfg, the server's log, one empty working
    directory per run) and the server for SCRIPT in the isolated environment over BASE_ENV."""

    def __init__(self, script: Path, base_env: dict[str, str]):
        self.home = Path(tempfile.mkdtemp(prefix="nodeprep-ansible-"))
        (self.home / "ansible.cfg").write_text("")
        self.env = isolated_env(base_env, self.home)
        try:
            self.oracle = Oracle(script, self.env, self.new_cwd(), self.home / "server.log")
        except BaseException:
            shutil.rmtree(self.home, ignore_errors=True)
            raise

    def new_cwd(self) -> Path:
        return Path(tempfile.mkdtemp(prefix="cwd-", dir=self.home))

    def close(self) -> None:
        self.oracle.close()
        shutil.rmtree(self.home, ignore_errors=True)


_SHARED: dict[tuple, Session] = {}
_SHARED_LOCK = threading.Lock()


def shared(script: Path, base_env: dict[str, str]) -> Session:
    """The test process's Session for SCRIPT over BASE_ENV: started on first use, closed at
    exit."""
    key = (str(script), tuple(sorted(base_env.items())))
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = Session(script, base_env)
            atexit.register(_SHARED[key].close)
        return _SHARED[key]


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
