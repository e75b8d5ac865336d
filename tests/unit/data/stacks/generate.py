"""How the *.stack files here were made: real faulthandler output of real processes, written
as they came (the two lines at the top of rank-appended.stack, which stand for other text in
a rank's file, are written by this script before the process starts). Not run by the tests;
rerun by hand to refresh them:

    .venv/bin/python tests/unit/data/stacks/generate.py

Each scenario is a small script placed under /tmp/nodeprep-stacks (a fixed place, so the paths
in the dumps stay the same from one run to the next) and started the way the ranks are (through
nodeprep's rank.py wrapper, faulthandler registered on its STACK_SIGNAL) or registering
faulthandler itself; the script writes a `ready` file once it is where it should be dumped,
the signal is sent, and the process is killed once the dump is written."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RANK_PY = HERE.parents[3] / "src" / "nodeprep" / "ops" / "payloads" / "rank.py"
WORK = Path("/tmp/nodeprep-stacks")
STACK_SIGNAL = signal.SIGRTMIN + 4  # the signal rank.py registers

DDP = """\
import os
import threading
import time


def heartbeat():
    while True:
        time.sleep(5)


def train_step(step):
    return step + 1


def main():
    threading.Thread(target=heartbeat, name="heartbeat", daemon=True).start()
    step = train_step(0)
    open(os.environ["READY"], "w").close()
    while True:                     # the hung rank: a user loop, no collective
        time.sleep(1)


if __name__ == "__main__":
    main()
"""

FAKELIB = '''\
import threading

_DONE = threading.Event()


def _wait_work(timeout):
    return _DONE.wait(timeout)


def all_reduce(tensor, timeout=None):
    """Stands for a collective: blocks until every peer has joined (never, here)."""
    return _wait_work(timeout)
'''

TRAIN = """\
import os
from concurrent.futures import ThreadPoolExecutor

import fakelib


def step(pool, batch):
    pool.submit(sum, batch)
    open(os.environ["READY"], "w").close()
    return fakelib.all_reduce(batch)


def main():
    with ThreadPoolExecutor(1, thread_name_prefix="loader") as pool:
        for i in range(10):
            step(pool, [i, i])


main()
"""

EVENT = """\
import faulthandler
import os
import signal
import threading

faulthandler.register(signal.SIGUSR1, file=open(os.environ["STACK"], "a"), all_threads=True, chain=False)


def wait_for_peers():
    ev = threading.Event()
    open(os.environ["READY"], "w").close()
    ev.wait()


wait_for_peers()
"""  # noqa: E501 (the recorded dumps give its line numbers)

APPENDED = """\
import faulthandler
import os
import signal
import time

faulthandler.register(signal.SIGUSR1, file=open(os.environ["STACK"], "a"), all_threads=True, chain=False)


def load_data():
    open(os.environ["READY"], "w").close()
    while not os.path.exists(os.environ["GO"]):
        time.sleep(0.05)


def evaluate():
    open(os.environ["READY2"], "w").close()
    while True:
        time.sleep(1)


load_data()
evaluate()
"""  # noqa: E501 (the recorded dumps give its line numbers)

SINGLE = """\
import faulthandler
import os
import threading


def worker():
    threading.Event().wait()


def report():
    with open(os.environ["STACK"], "a") as f:
        faulthandler.dump_traceback(file=f, all_threads=False)


def main():
    threading.Thread(target=worker, daemon=True).start()
    report()


main()
"""

DEEP = """\
import faulthandler
import os
import signal
import time

faulthandler.register(signal.SIGUSR1, file=open(os.environ["STACK"], "a"), all_threads=True, chain=False)


def descend(n):
    if n == 0:
        open(os.environ["READY"], "w").close()
        while True:
            time.sleep(1)
    return descend(n - 1)


descend(150)
"""  # noqa: E501 (the recorded dumps give its line numbers)

MANY = """\
import _thread
import faulthandler
import os
import signal
import time

faulthandler.register(signal.SIGUSR1, file=open(os.environ["STACK"], "a"), all_threads=True, chain=False)


def idle():
    while True:
        time.sleep(5)


for _ in range(105):
    _thread.start_new_thread(idle, ())
time.sleep(0.5)
open(os.environ["READY"], "w").close()
while True:
    time.sleep(1)
"""  # noqa: E501 (the recorded dumps give its line numbers)


def wait_for(path, timeout=20.0):
    end = time.time() + timeout
    while not path.exists():
        if time.time() > end:
            raise SystemExit(f"timed out waiting for {path}")
        time.sleep(0.02)


def wait_written(path, before=0):
    """Until PATH has grown past BEFORE bytes and stopped growing."""
    size, end = -1, time.time() + 20
    while time.time() < end:
        time.sleep(0.3)
        now = path.stat().st_size if path.exists() else 0
        if now > before and now == size:
            return
        size = now
    raise SystemExit(f"no dump in {path}")


def start(d, argv, env):
    return subprocess.Popen(
        [sys.executable, *argv], cwd=d, env=dict(os.environ, **env), stdin=subprocess.DEVNULL
    )


def dump_once(name, script, sig=signal.SIGUSR1, wrapped=False, files=None):
    """Run SCRIPT (as NAME.py) in its own folder, dump its stacks once, return the dump."""
    d = WORK / name
    d.mkdir(parents=True)
    for rel, text in {**(files or {}), f"{name}.py": script}.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(text)
    stack, ready = d / f"{name}.stack", d / "ready"
    env = {"READY": str(ready), "STACK": str(stack), "NODEPREP_STACK_FILE": str(stack)}
    if files:
        env["PYTHONPATH"] = str(d / "venv/lib/python3.11/site-packages")
    argv = [str(RANK_PY), "--exec", str(d / f"{name}.py")] if wrapped else [str(d / f"{name}.py")]
    p = start(d, argv, env)
    try:
        wait_for(ready)
        time.sleep(0.3)
        if sig is not None:
            os.kill(p.pid, sig)
        wait_written(stack)
    finally:
        p.kill()
        p.wait()
    return stack.read_text()


def appended():
    d = WORK / "appended"
    d.mkdir(parents=True)
    (d / "evaluate.py").write_text(APPENDED)
    stack = d / "rank-3.stack"
    stack.write_text(
        "W0612 10:41:07 rank 3: NCCL_ASYNC_ERROR_HANDLING is deprecated\nattempt 1 started\n"
    )
    env = {k: str(d / k.lower()) for k in ("READY", "READY2", "GO")}
    p = start(d, [str(d / "evaluate.py")], dict(env, STACK=str(stack)))
    try:
        wait_for(d / "ready")
        time.sleep(0.3)
        size = stack.stat().st_size
        os.kill(p.pid, signal.SIGUSR1)
        wait_written(stack, size)
        (d / "go").touch()
        wait_for(d / "ready2")
        time.sleep(0.3)
        size = stack.stat().st_size
        os.kill(p.pid, signal.SIGUSR1)
        wait_written(stack, size)
    finally:
        p.kill()
        p.wait()
    return stack.read_text()


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    out = {
        "rank-sleep.stack": dump_once("ddp", DDP, STACK_SIGNAL, wrapped=True),
        "rank-fakelib.stack": dump_once(
            "train",
            TRAIN,
            STACK_SIGNAL,
            wrapped=True,
            files={
                "venv/lib/python3.11/site-packages/fakelib/__init__.py": (
                    "from .collective import all_reduce\n"
                ),
                "venv/lib/python3.11/site-packages/fakelib/collective.py": FAKELIB,
            },
        ),
        "rank-event.stack": dump_once("peers", EVENT),
        "rank-appended.stack": appended(),
        "stack-single.stack": None,
        "rank-deep.stack": dump_once("deep", DEEP),
        "rank-many-threads.stack": dump_once("threads", MANY),
    }
    d = WORK / "single"
    d.mkdir(parents=True)
    (d / "report.py").write_text(SINGLE)
    subprocess.run(
        [sys.executable, str(d / "report.py")],
        env=dict(os.environ, STACK=str(d / "s.stack")),
        check=True,
        timeout=30,
    )
    out["stack-single.stack"] = (d / "s.stack").read_text()
    for name, text in out.items():
        (HERE / name).write_text(text)


if __name__ == "__main__":
    main()
