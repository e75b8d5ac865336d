"""`invoke train`: sync the job directory to the same absolute path on every node, preflight
what makes launches hang, start the payload with the chosen launcher, stream node-prefixed
output, and stop every rank on every node when one fails, on --timeout, or on Ctrl-C.

Every process of a job carries PYTHON_NODEPREP_JOB=<id> in its environment (DeepSpeed's runner
forwards PYTHON* variables to every rank, mpirun gets -x, torchrun inherits it), so cleanup
kills the process groups of exactly those processes on every node: never a broad `pkill -f`.
"""
from __future__ import annotations

import hashlib
import posixpath
import secrets
import shlex
import sys
import threading
import time
from pathlib import Path

from . import facts as factmod
from . import launchers, pystack, verify
from .errors import InputError, NodeprepError
from .executor import Fleet
from .report import Display

JOB_VAR = "PYTHON_NODEPREP_JOB"
SKIP = {".git", "__pycache__", ".venv", ".nodeprep", "node_modules"}

CLEANUP = r'''
# dash's builtin kill rejects `--` and errors went to /dev/null, so use procps kill, and
# select process groups with `ps -e -o pgid=` (ps -g means session).
id="$1"; pgs=""
for p in /proc/[0-9]*; do
  [ "${p#/proc/}" = "$$" ] && continue
  if { tr '\0' '\n' < "$p/environ"; } 2>/dev/null | grep -qxF "PYTHON_NODEPREP_JOB=$id"; then
    pg=$(ps -o pgid= -p "${p#/proc/}" 2>/dev/null | tr -d ' ')
    [ -n "$pg" ] && pgs="$pgs $pg"
  fi
done
pgs=$(echo $pgs | tr ' ' '\n' | sort -u)
[ -z "$pgs" ] && { echo "stopped 0"; exit 0; }
alive() { ps -e -o pgid=,stat= | awk -v g="$1" '$1 == g && $2 !~ /^Z/ {n++} END {exit !n}'; }
for pg in $pgs; do /bin/kill -s TERM -- "-$pg" 2>/dev/null; done
i=0
while [ $i -lt 50 ]; do
  left=0
  for pg in $pgs; do alive "$pg" && left=1; done
  [ $left -eq 0 ] && break
  sleep 0.1; i=$((i+1))
done
for pg in $pgs; do alive "$pg" && /bin/kill -s KILL -- "-$pg" 2>/dev/null; done
echo "stopped $(echo $pgs | wc -w) process group(s)"
'''


def resolve_payload(payload: str) -> tuple[Path, Path]:
    """(local directory to sync, script inside it) for a builtin name or a path."""
    from . import payloads
    if payload in payloads.BUILTIN:
        script = Path(payloads.BUILTIN[payload])
        return script.parent, script
    p = Path(payload).expanduser()
    if not p.is_file():
        raise InputError(f"--payload {payload!r}: not a builtin ({', '.join(payloads.BUILTIN)}) "
                         "and not a file", hint="give a script path or health/ddp")
    return p.resolve().parent, p.resolve()


def local_files(root: Path, only: Path | None = None) -> dict[str, Path]:
    if only is not None and only.parent == Path(__file__).parent / "payloads":
        return {only.name: only}    # a builtin: just its own script
    files = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not any(part in SKIP for part in p.relative_to(root).parts):
            files[str(p.relative_to(root))] = p
            if len(files) > 2000:
                raise InputError(f"{root} holds more than 2000 files to sync",
                                 hint="put the training script in a directory of its own")
    return files


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def sync(session, files: dict[str, Path], job_dir: str) -> int:
    """Push only the files whose sha256 differs on the node; returns how many were pushed."""
    names = " ".join(shlex.quote(n) for n in files)
    r = session.run(f"mkdir -p {shlex.quote(job_dir)} && cd {shlex.quote(job_dir)} && "
                    f"sha256sum -- {names} 2>/dev/null; true", label="job sums", log_output=False)
    have = {}
    for line in r.stdout.splitlines():
        sha, _, name = line.partition("  ")
        have[name] = sha
    pushed = 0
    sftp = session.conn.sftp()
    for name, path in files.items():
        if have.get(name) == _sha(path):
            continue
        dest = posixpath.join(job_dir, name)
        session.run(f"mkdir -p {shlex.quote(posixpath.dirname(dest))}", label="mkdir")
        sftp.put(str(path), dest + ".part")
        sftp.posix_rename(dest + ".part", dest)
        pushed += 1
    return pushed


class Job:
    def __init__(self, inv, hosts, settings, launcher, payload, args, timeout, max_restarts,
                 port, ds_launcher, preflight):
        self.inv, self.hosts, self.settings = inv, hosts, settings
        self.launcher, self.args, self.timeout = launcher, list(args), timeout
        self.max_restarts, self.port, self.ds_launcher = max_restarts, port, ds_launcher
        self.preflight = preflight
        self.root, self.script = resolve_payload(payload)
        self.files = local_files(self.root, self.script)
        self.id = time.strftime("%Y%m%d%H%M%S") + "-" + secrets.token_hex(3)
        self.vars = {h.name: {n: inv.var(h, n) for n in inv.schema} for h in hosts}
        self.head = hosts[0]
        self.display = Display.auto(quiet=True)

    # -- stages ------------------------------------------------------------------------------
    def prepare(self, fleet) -> None:
        """Facts, job dir sync and preflight; raises NodeprepError listing what blocks."""
        names = [h.name for h in self.hosts]
        got = fleet.map(lambda s: factmod.gather(s, ["user", "gpus", "interfaces",
                                                     ("venv", self.vars[s.name]["venv_path"])]
                                                 + ([("port_listening", self.port)] if s.name == self.head.name else []),
                                                 self.vars[s.name]), "facts")
        self._fail_if_nodes_failed(fleet)
        self.facts = got
        homes = {got[n]["user"]["home"] for n in names}
        pys = {pystack.venv_path(self.vars[n], got[n]) for n in names}
        problems = []
        if len(homes) > 1 or len(pys) > 1:
            problems.append(f"home or venv path differs between nodes ({', '.join(sorted(homes | pys))}): "
                            "the launchers start the head node's interpreter and cwd everywhere")
        self.python = next(iter(pys)) + "/bin/python"
        self.job_dir = posixpath.join(next(iter(homes)), ".nodeprep", "jobs", self.root.name)
        for n in names:
            if not got[n][f"venv:{self.vars[n]['venv_path']}"]["exists"]:
                problems.append(f"{n}: no venv at {self.vars[n]['venv_path']} (run `invoke provision`)")
        if got[self.head.name].get(f"port_listening:{self.port}"):
            problems.append(f"{self.head.name}: master port {self.port} is already in use (--port)")
        if self.preflight and self.launcher in ("deepspeed", "mpirun"):
            head = fleet.sessions[self.head.name]
            mesh = verify.parse_mesh(head.run(verify.mesh_script(names), timeout=60,
                                              label="preflight mesh").stdout)
            problems += [f"{self.head.name} -> {p}: ssh fails (exit {rc}) {err}".rstrip()
                         for p, (rc, err) in sorted(mesh.items()) if rc != 0]
        if problems and self.preflight:
            raise NodeprepError("preflight failed:\n  " + "\n  ".join(problems),
                                hint="fix these, or --no-preflight to launch anyway")
        pushed = fleet.map(lambda s: sync(s, self.files, self.job_dir), "sync")
        self._fail_if_nodes_failed(fleet)
        self.display.note(self.head.name, f"job {self.id}: {sum(pushed.values())} file(s) pushed to "
                                          f"{self.job_dir} on {len(names)} node(s)")

    def _fail_if_nodes_failed(self, fleet):
        bad = {n: r.message for n, r in fleet.results.items() if r.status in ("failed", "unreachable")}
        if bad:
            raise NodeprepError("cannot start the job: " + "; ".join(f"{n}: {m}" for n, m in bad.items()))

    def slots(self, name) -> int:
        h = next(h for h in self.hosts if h.name == name)
        return h.slots or self.facts[name]["gpus"]["count"] or 1

    def master_addr(self) -> str:
        return self.head.address

    def commands(self) -> dict[str, str]:
        """node -> shell command (run from the job dir, tagged with the job id)."""
        script = self.script.name if self.script.parent == self.root else str(self.script.relative_to(self.root))
        nodes = [launchers.NodeSlots(h.name, h.address, self.slots(h.name), h.port) for h in self.hosts]
        env = f"export {JOB_VAR}={self.id} MASTER_ADDR={shlex.quote(self.master_addr())} MASTER_PORT={self.port}; "
        cd = f"cd {shlex.quote(self.job_dir)} && "
        if self.launcher == "torchrun":
            argv = launchers.torchrun_cmd(self.python, script, self.args, len(nodes), nodes[0].slots,
                                          f"{self.master_addr()}:{self.port}", self.id, self.max_restarts)
            return {n.name: cd + env + shlex.join(argv) for n in nodes}
        if self.launcher == "deepspeed":
            argv = launchers.deepspeed_cmd(self.python, script, self.args, nodes, self.master_addr(),
                                           self.port, self.ds_launcher,
                                           ssh_port=self.head.port if self.head.port != 22 else None)
            argv = launchers.fill_hostfile(argv, "hostfile")
            write = f"printf %s {shlex.quote(launchers.hostfile(nodes))} > hostfile && "
            return {self.head.name: cd + write + env + shlex.join(argv)}
        if self.launcher == "srun":
            argv = launchers.srun_cmd(self.python, script, self.args, nodes, nodes[0].slots,
                                      {JOB_VAR: self.id, "MASTER_ADDR": self.master_addr(),
                                       "MASTER_PORT": str(self.port)})
            return {self.head.name: cd + shlex.join(argv)}
        if self.launcher == "mpirun":
            argv = launchers.mpirun_cmd(self.python, script, self.args, nodes, self.master_addr(),
                                        self.port, [JOB_VAR])
            return {self.head.name: cd + env + shlex.join(argv)}
        raise InputError(f"--launcher {self.launcher}: not runnable here")

    # -- running -----------------------------------------------------------------------------
    def cleanup(self, fleet) -> dict[str, str]:
        script = f"set -- {shlex.quote(self.id)}\n" + CLEANUP
        # All nodes at once (a new channel beside the running one); a node that cannot be
        # reached is marked by the fleet and named in the report.
        out = fleet.map(lambda s: s.run(script, timeout=30, label="stop job").stdout.strip(), "stop")
        return {n: out.get(n, "cleanup failed: " + fleet.results[n].message) for n in fleet.sessions}

    def launch(self, fleet) -> int:
        cmds = self.commands()
        results: dict[str, object] = {}
        threads = []
        for node, cmd in cmds.items():
            s = fleet.sessions[node]
            s.stage = "train"
            t = threading.Thread(target=lambda s=s, cmd=cmd: results.__setitem__(
                s.name, s.run(cmd, stream=True, timeout=(self.timeout or 86400) + 60, label="train")),
                daemon=True)
            t.start()
            threads.append(t)
        deadline = time.monotonic() + self.timeout if self.timeout else None
        reason = None
        try:
            while any(t.is_alive() for t in threads):
                bad = [n for n, r in results.items() if r.rc != 0]
                if bad:
                    reason = f"{', '.join(bad)} exited {results[bad[0]].rc}"
                    break
                if deadline and time.monotonic() > deadline:
                    reason = f"--timeout {self.timeout}s reached"
                    break
                time.sleep(0.1)
        except KeyboardInterrupt:
            reason = "interrupted"
        if reason is None:
            bad = [n for n, r in results.items() if r.rc != 0]
            reason = f"{', '.join(bad)} exited {results[bad[0]].rc}" if bad else None
        stopped = self.cleanup(fleet)
        for t in threads:
            t.join(timeout=15)
        if reason is None:
            print(f"train: job {self.id} finished on {len(self.hosts)} node(s)", file=sys.stderr)
            return 0
        print(f"train: job {self.id} FAILED: {reason}; stopped every rank "
              f"({', '.join(f'{n}: {v}' for n, v in stopped.items())})", file=sys.stderr)
        for n, r in results.items():
            if r.rc != 0 and r.tail():
                print(f"--- last lines from {n}:\n{r.tail(15)}", file=sys.stderr)
        return 130 if reason == "interrupted" else 1


def run(inv, hosts, settings, launcher, payload, args=(), timeout=None, max_restarts=0, port=29500,
        ds_launcher="pdsh", preflight=True, dry_run=False) -> int:
    job = Job(inv, hosts, settings, launcher, payload, args, timeout, max_restarts, port,
              ds_launcher, preflight)
    with Fleet(hosts, settings, "train", job.display) as fleet:
        job.prepare(fleet)
        if dry_run or launcher == "srun":
            cmds = job.commands()
            for node, cmd in cmds.items():
                print(f"{node}: {cmd}")
            if launcher == "srun" and not dry_run:
                head = fleet.sessions[job.head.name]
                if not head.run("command -v srun", label="srun?").ok:
                    raise NodeprepError(f"srun not found on {job.head.name}: no Slurm here; the "
                                        "command above is what would run inside an allocation")
                return job.launch(fleet)
            return 0
        return job.launch(fleet)
