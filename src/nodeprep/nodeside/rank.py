"""nodeprep's rank wrapper: every launcher starts `python -u rank.py SCRIPT ARGS...` instead of
the training script, on every node. Standalone (stdlib only): it runs in the nodes' venv.

The wrapper is the rank's parent, so it learns how the rank ended (exit status or signal,
an OOM kill from the cgroup's counters or the kernel log where readable) and records it:

  ~/.nodeprep/runs/<job>/ranks/<R>.<attempt>.start   {rank, pid, child, machine, ...}
  ~/.nodeprep/runs/<job>/ranks/<R>.<attempt>.exit    {rc, signal, oom, end, failed_at}
  ~/.nodeprep/runs/<job>/rank-<R>.out / .err         the rank's stdout / stderr (appended)
  ~/.nodeprep/runs/<job>/rank-<R>.stack              Python stacks dumped on STACK_SIGNAL

failed_at: when the script itself raised or called sys.exit with a failure (the child stamps it
before the interpreter tears down: the moment the rank failed, not the later moment its exit
was seen; ranks that die of the broken connections it leaves come after it).
teardown_rc, done_at: the script returned (or exited 0) and every exit handler it registered
ran (the child stamps <R>.<attempt>.done from the first atexit handler, which runs last), then
the interpreter's own teardown crashed (torch's gloo threads can abort there: "terminate called
without an active exception"). Nothing of the script was cut short: the wrapper exits 0 and
records the crash, and nodeprep reports it as a warning of a finished rank.
A fatal signal in the child (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL) writes faulthandler's
dump of every Python thread to rank-<R>.stack: where the rank was when it died.
The node's watcher (watch.py) reads these and streams them to the controller. The child runs
the script as __main__ with faulthandler registered on STACK_SIGNAL, so a hung rank's stack
can be dumped without ptrace. The wrapper forwards TERM/INT/HUP/USR1/USR2 to the child and
ends the way the child ended (same status, same signal), so launchers see no difference; a
restart by torchrun starts a new wrapper: attempt + 1.

One rank contract for every launcher (contract_env): RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE (and, under Slurm, MASTER_ADDR/MASTER_PORT) from the launcher's own variables
where it did not set them (OMPI_COMM_WORLD_*, PMI_*/MPI_LOCALRANKID, PMIX_RANK, SLURM_*): a plain
`dist.init_process_group()` runs unchanged under every launcher; NODEPREP_RESTART, the attempt
`train --restarts` relaunched (0 first). One argument contract (local_rank_args): a script
declaring --local_rank (or --local-rank) in argparse always gets it, one that does not never
does (DeepSpeed's launcher passes it to every script, torchrun to none).
"""

import atexit
import faulthandler
import json
import os
import re
import runpy
import signal
import subprocess
import sys
import time

JOB_VAR = "PYTHON_NODEPREP_JOB"
RESTART_VAR = "PYTHON_NODEPREP_RESTART"  # engine/facts/jobs.py: train --restarts' attempt
RUNS = ".nodeprep/runs"  # under the home: a job's run directory is RUNS/<job>
STACK_SIGNAL = signal.SIGRTMIN + 4  # rarely used; SIGUSR1/2 belong to the user (Slurm, ...)
FORWARD = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def rank_env():
    """(rank, local rank) from whichever launcher started us; (None, None) if none says."""
    for names in (
        ("RANK", "LOCAL_RANK"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"),
        ("SLURM_PROCID", "SLURM_LOCALID"),
        ("PMI_RANK", "MPI_LOCALRANKID"),
    ):
        if names[0] in os.environ:
            return int(os.environ[names[0]]), int(os.environ.get(names[1], "0") or 0)
    return None, None


# Each contract variable and the launchers' variables it is taken from, in order.
CONTRACT = (
    ("RANK", ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")),
    ("WORLD_SIZE", ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "SLURM_NPROCS")),
    ("LOCAL_RANK", ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID")),
    (
        "LOCAL_WORLD_SIZE",
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "LOCAL_SIZE"),
    ),  # DeepSpeed's
)


def slurm_tasks_here(tasks_per_node, node_id):
    """This node's task count from SLURM_TASKS_PER_NODE ("2(x3),1": 2 on each of 3 nodes,
    then 1) and SLURM_NODEID; None if either is unreadable."""
    try:
        counts = []
        for part in tasks_per_node.split(","):
            m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
            counts += [int(m.group(1))] * int(m.group(2) or 1)
        return counts[int(node_id)]
    except (AttributeError, ValueError, IndexError, TypeError):
        return None


def first_host(nodelist):
    """The first host of a Slurm node list ("gpu[007-009,012],cpu1" -> "gpu007")."""
    m = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist or "")
    if not m:
        return None
    return m.group(1) + (re.split(r"[-,]", m.group(2))[0] if m.group(2) else "")


def contract_env(env):
    """The variables to ADD to ENV (a dict) so the script sees the rank contract."""
    add = {"NODEPREP_RESTART": env.get(RESTART_VAR, "0")}  # train --restarts' relaunch (0: none)
    if add["NODEPREP_RESTART"] != "0":  # on top of the count torchrun's own agent keeps
        agent = env.get("TORCHELASTIC_RESTART_COUNT", "0")
        add["TORCHELASTIC_RESTART_COUNT"] = str(int(add["NODEPREP_RESTART"]) + int(agent or 0))
    for var, sources in CONTRACT:
        if var not in env:
            got = next((env[s] for s in sources if env.get(s, "") != ""), None)
            if got is not None:
                add[var] = got
    if (
        "LOCAL_WORLD_SIZE" not in env
        and "LOCAL_WORLD_SIZE" not in add
        and "SLURM_TASKS_PER_NODE" in env
    ):
        n = slurm_tasks_here(env["SLURM_TASKS_PER_NODE"], env.get("SLURM_NODEID", "0"))
        if n is not None:
            add["LOCAL_WORLD_SIZE"] = str(n)
    if "SLURM_PROCID" in env and "MASTER_ADDR" not in env:
        host = first_host(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST"))
        if host:
            add["MASTER_ADDR"] = host
    if "SLURM_PROCID" in env and "MASTER_PORT" not in env:
        add["MASTER_PORT"] = "29500"  # torch's own default port
    return add


LOCAL_RANK_ARG = re.compile(r"""add_argument\([^)]*?['"]--local[_-]rank['"]""", re.S)


def declares_local_rank(script):
    """Does SCRIPT's argparse declare --local_rank / --local-rank (read as text)?"""
    try:
        with open(script, encoding="utf-8", errors="replace") as f:
            return bool(LOCAL_RANK_ARG.search(f.read()))
    except OSError:
        return False


def local_rank_args(argv, local_rank):
    """ARGV (script first) with --local_rank as the script declares it: given once when it
    does (the launcher's own value kept), dropped when it does not."""
    script = argv[0]
    rest = []
    found = []
    i = 1
    while i < len(argv):
        a = argv[i]
        if a.startswith("--local_rank") or a.startswith("--local-rank"):
            take = 1 if "=" in a else 2
            found += argv[i : i + take]
            i += take
            continue
        rest.append(a)
        i += 1
    if not declares_local_rank(script):
        return [script, *rest]
    if found:
        return [script, *rest, *found]
    return [script, *rest] + ([f"--local_rank={local_rank}"] if local_rank is not None else [])


def run_dir(job):
    return os.path.join(os.path.expanduser("~"), RUNS, job)


def machine_key():
    """This machine (boot id) and network namespace: the watcher on the same node has the same
    key, while a shared (NFS) home also holds the records of other machines."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = os.uname().nodename
    try:
        netns = os.readlink("/proc/self/ns/net")
    except OSError:
        netns = ""
    return f"{boot}/{netns}"


def write_json(path, obj):
    tmp = f"{path}.{os.getpid()}.part"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def oom_kills():
    """The oom_kill counter of this process's cgroup (v2), or None where unreadable."""
    try:
        with open("/proc/self/cgroup") as f:
            path = next(ln.split(":", 2)[2].strip() for ln in f if ln.startswith("0::"))
        with open(f"/sys/fs/cgroup{path}/memory.events") as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, StopIteration, ValueError):
        pass
    return None


def oom_in_kernel_log(pid):
    """True if the kernel log says the OOM killer killed PID (None: log not readable)."""
    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return any(
        f"Killed process {pid} " in ln or f"Killed process {pid}," in ln
        for ln in out.stdout.splitlines()[-200:]
    )


def child_env(d, rank, base):
    env = dict(
        os.environ,
        PYTHONUNBUFFERED="1",
        NODEPREP_FAIL_FILE=base + ".fail",
        NODEPREP_DONE_FILE=base + ".done",
        NODEPREP_STACK_FILE=os.path.join(d, f"rank-{rank}.stack"),
        NODEPREP_HEARTBEAT=os.path.join(d, f"rank-{rank}.beat"),
    )
    if os.path.exists("/dev/nvidiactl"):
        # PyTorch's NCCL flight recorder: on a collective timeout each rank dumps its last
        # collectives next to the stacks (both names: TORCH_FR_* from 2.7 on)
        trace = os.path.join(d, "nccl_trace_rank_")
        env.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000")
        env.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
        env.setdefault("TORCH_FR_DUMP_TEMP_FILE", trace)
        env.setdefault("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", trace)
    return env


def attempt_of(ranks, rank):
    n = sum(1 for f in os.listdir(ranks) if f.startswith(f"{rank}.") and f.endswith(".start"))
    return n + 1


def script_first(argv):
    """DeepSpeed's launch.py puts --local_rank=N right after what it thinks is the script
    (this wrapper): move it behind the real script, where the script expects it."""
    lead = []
    while argv and (argv[0].startswith("--local_rank") or argv[0].startswith("--local-rank")):
        take = 1 if "=" in argv[0] else 2
        lead, argv = lead + argv[:take], argv[take:]
    return argv + lead


def exit_record(base: str, pid: int, status: int, oom0, rank: int, attempt: int):
    """(exit record, exit status) of the script's process PID, ended with STATUS: OOM by the
    kernel's count (OOM0 at the start) or log, its failure stamp, a teardown-only crash."""
    ended = time.time()  # before the OOM lookup (dmesg may take seconds)
    rc = os.waitstatus_to_exitcode(status)
    oom = None
    if rc == -signal.SIGKILL:
        oom1 = oom_kills()
        oom = (oom1 > oom0) if oom0 is not None and oom1 is not None else oom_in_kernel_log(pid)
    record = {"rank": rank, "attempt": attempt, "rc": rc, "oom": oom, "end": ended}
    failed = read_stamp(base + ".fail", float, int)
    if failed:
        record["failed_at"], record["script_rc"] = failed
    done_at = (read_stamp(base + ".done", float) or [None])[0]
    if rc != 0 and done_at is not None and "failed_at" not in record:
        # the script and its exit handlers had ended: only the interpreter's teardown crashed
        record.update(rc=0, teardown_rc=rc, done_at=done_at)
        rc = 0
    return record, rc


def wrap(argv):
    os.environ.update(contract_env(os.environ))
    job = os.environ.get(JOB_VAR)
    rank, local = rank_env()
    argv = local_rank_args(script_first(argv), local)
    if not job or rank is None:  # not under nodeprep: just be the script
        os.execv(sys.executable, [sys.executable, "-u", *argv])
    d = run_dir(job)
    ranks = os.path.join(d, "ranks")
    os.makedirs(ranks, exist_ok=True)
    attempt = attempt_of(ranks, rank)
    base = os.path.join(ranks, f"{rank}.{attempt}")
    oom0 = oom_kills()
    with (
        open(os.path.join(d, f"rank-{rank}.out"), "ab") as out,
        open(os.path.join(d, f"rank-{rank}.err"), "ab") as err,
    ):
        child = subprocess.Popen(
            [sys.executable, "-u", os.path.abspath(__file__), "--exec", *argv],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env=child_env(d, rank, base),
        )
    for sig in FORWARD:
        signal.signal(sig, lambda s, _f: child.send_signal(s))
    write_json(
        base + ".start",
        {
            "rank": rank,
            "local_rank": local,
            "attempt": attempt,
            "pid": os.getpid(),
            "child": child.pid,
            "machine": machine_key(),
            "node": os.environ.get("NODEPREP_NODE"),
            "host": os.uname().nodename,
            "start": time.time(),
        },
    )
    _, status = os.waitpid(child.pid, 0)  # retried by Python on EINTR (PEP 475)
    record, rc = exit_record(base, child.pid, status, oom0, rank, attempt)
    write_json(base + ".exit", record)
    if rc < 0:  # end the way the child ended: the same signal
        if -rc != signal.SIGKILL:  # SIGKILL's disposition cannot be set (EINVAL): it is the default
            signal.signal(-rc, signal.SIG_DFL)
        os.kill(os.getpid(), -rc)
        time.sleep(1)
        sys.exit(128 - rc)
    sys.exit(rc)


def run_script(argv):
    """Child mode: the script as __main__ (as `python SCRIPT` would), stacks dumpable."""
    stack = os.environ.get("NODEPREP_STACK_FILE")
    if stack:
        dump = open(stack, "a")
        faulthandler.register(STACK_SIGNAL, file=dump, all_threads=True, chain=False)
        faulthandler.enable(file=dump, all_threads=True)  # a fatal signal: where every thread was
    atexit.register(mark_done, os.getpid())  # registered first, so it runs after the script's own
    script = argv[0]
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            mark_failed(e.code if isinstance(e.code, int) else 1)
        raise
    except BaseException:
        mark_failed(1)
        raise


FAILED = []


def mark_failed(code):
    """Stamp the moment the script failed and the status it exits with (before teardown closes
    its connections, and before a launcher's TERM may cut that teardown short)."""
    FAILED.append(code)
    stamp("NODEPREP_FAIL_FILE", f"{time.time()!r} {int(code)}")


def mark_done(pid):
    """atexit, last: the script ended well and its exit handlers ran; what follows is the
    interpreter's own teardown. Only in the rank's own process (PID), not in a child the
    script forked that ends through its exit handlers."""
    if not FAILED and os.getpid() == pid:
        stamp("NODEPREP_DONE_FILE", repr(time.time()))


def stamp(var, text):
    path = os.environ.get(var)
    if path:
        try:
            with open(path, "w") as f:
                f.write(text)
        except OSError:
            pass


def read_stamp(path, *kinds):
    """The fields of a stamp file (as mark_failed / mark_done wrote them), each read by its kind;
    None when it is missing or not whole."""
    try:
        with open(path) as f:
            fields = f.read().split()
    except OSError:
        return None
    if len(fields) != len(kinds):
        return None
    try:
        return [kind(v) for kind, v in zip(kinds, fields)]
    except ValueError:
        return None


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: rank.py SCRIPT [ARGS...]")
    if sys.argv[1] == "--exec":
        run_script(sys.argv[2:])
    else:
        wrap(sys.argv[1:])
