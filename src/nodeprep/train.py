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
from dataclasses import dataclass
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


EMU_PREFIX = "emu-"
EMU_BLOCK = "emulated nodes"


@dataclass
class Emulation:
    """One machine as M nodes: ssh aliases EMU_PREFIX0.. to it, per-node slots and GPUs."""
    machine: str
    names: list[str]
    per_node: int                  # processes per emulated node
    hostfile_slots: list[int]      # what the hostfile says (all K GPUs with --include)
    devices: list[list[int]] | None  # GPUs of each emulated node (None: CPU)
    include: str | None
    cuda_visible: list[str]
    network: bool

    def describe(self) -> str:
        if self.devices:
            share = ", ".join(f"{n}: GPU {','.join(map(str, d))}" for n, d in zip(self.names, self.devices))
        else:
            share = f"no GPU: {self.per_node} CPU process each"
        return (f"emulating {len(self.names)} nodes on {self.machine} ({share})"
                + ("; NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1" if self.network else ""))


def check_emulate(m, hosts, launcher) -> None:
    if not isinstance(m, int) or m < 1:
        raise InputError(f"--emulate {m!r}: expected a number of nodes >= 1")
    if len(hosts) != 1:
        raise InputError(f"--emulate makes ONE machine look like {m} nodes, but {len(hosts)} nodes "
                         "are selected", hint="pick the machine with --limit NODE")
    if launcher == "srun":
        raise InputError("--emulate with srun: Slurm places tasks itself",
                         hint="use --launcher deepspeed, torchrun or mpirun")


def plan_emulation(host, m: int, gpus: int, launcher: str, network: bool) -> Emulation:
    names = [f"{EMU_PREFIX}{k}" for k in range(m)]
    if not gpus:   # a CPU machine: one process per emulated node, nothing to split
        return Emulation(host.name, names, 1, [1] * m, None, None, [], network)
    if launcher == "mpirun":
        raise InputError(f"--emulate with mpirun on {host.name}'s {gpus} GPU(s): Open MPI gives every "
                         "emulated node local ranks from 0, so they would share GPUs",
                         hint="use --launcher deepspeed (--include) or torchrun (CUDA_VISIBLE_DEVICES)")
    e = launchers.emulate(gpus, m, prefix=EMU_PREFIX)
    return Emulation(host.name, e["names"], e["slots"][0], [gpus] * m, e["devices"], e["include"],
                     e["cuda_visible"], network)


def alias_block(emu: Emulation, host) -> str:
    """~/.ssh/config entries for the emulated nodes: this machine's address and port, the
    cluster key, and the machine's own pinned host key (HostKeyAlias = the name its key is
    recorded under in ~/.ssh/known_hosts by provision's ssh mesh): no new trust is added."""
    from .hostkeys import host_entry
    return (f"Host {' '.join(emu.names)}\n    HostName {host.address}\n    Port {host.port}\n"
            f"    HostKeyAlias {host_entry(host.name, host.port)}\n"
            f"    IdentityFile ~/.ssh/nodeprep_cluster_ed25519\n    IdentitiesOnly yes\n")


def write_aliases(session, emu: Emulation, host) -> bool:
    """Put the alias block into the machine's ~/.ssh/config (atomically, other content kept);
    False when it was already there."""
    from .remote import write_script
    from .steps import with_block
    f = factmod.gather(session, [("file", "~/.ssh/config")])["file:~/.ssh/config"]
    if f["exists"] and f["content"] is None:
        raise NodeprepError(f"{host.name}: ~/.ssh/config is too big to manage")
    new = with_block(f["content"], EMU_BLOCK, alias_block(emu, host))
    if new == f["content"] and f["mode"] == 0o600:
        return False
    r = session.run(write_script("~/.ssh/config", new, 0o600), label="write ssh aliases", log_output=False)
    if not r.ok:
        raise NodeprepError(f"{host.name}: cannot write ~/.ssh/config: {r.tail(3)}")
    return True


class Job:
    def __init__(self, inv, hosts, settings, launcher, payload, args, timeout, max_restarts,
                 port, ds_launcher, preflight, emulate=0, emulate_network=False, display=None):
        self.inv, self.hosts, self.settings = inv, hosts, settings
        self.emulate, self.emulate_network = emulate, emulate_network
        self.emu: Emulation | None = None
        if emulate:
            check_emulate(emulate, hosts, launcher)
        self.launcher, self.args, self.timeout = launcher, list(args), timeout
        self.max_restarts, self.port, self.ds_launcher = max_restarts, port, ds_launcher
        self.preflight = preflight
        self.root, self.script = resolve_payload(payload)
        self.files = local_files(self.root, self.script)
        self.id = time.strftime("%Y%m%d%H%M%S") + "-" + secrets.token_hex(3)
        self.vars = {h.name: {n: inv.var(h, n) for n in inv.schema} for h in hosts}
        self.head = hosts[0]
        self.display = display or Display.auto(quiet=True)
        self.results: dict = {}

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
        if self.emulate:
            self.emu = plan_emulation(self.head, self.emulate, got[self.head.name]["gpus"]["count"],
                                      self.launcher, self.emulate_network)
            fleet.map(lambda s: write_aliases(s, self.emu, self.head), "emulate")
            self._fail_if_nodes_failed(fleet)
            self.display.note(self.head.name, self.emu.describe())
        if self.preflight and self.launcher in ("deepspeed", "mpirun"):
            head = fleet.sessions[self.head.name]
            peers = self.emu.names if self.emu else names
            mesh = verify.parse_mesh(head.run(verify.mesh_script(peers), timeout=60,
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

    def nodes(self) -> list[launchers.NodeSlots]:
        if self.emu:   # aliases carry HostName/Port in ~/.ssh/config: no --ssh_port
            return [launchers.NodeSlots(n, self.head.address, k, 22)
                    for n, k in zip(self.emu.names, self.emu.hostfile_slots)]
        return [launchers.NodeSlots(h.name, h.address, self.slots(h.name), h.port) for h in self.hosts]

    def srun_prefix(self):
        """srun --label starts each line with its task number; tasks go to the nodes in blocks
        of --ntasks-per-node (srun's default distribution), so the line gets its node's name."""
        nodes = self.nodes()
        names, per = [n.name for n in nodes], nodes[0].slots
        return lambda line: launchers.srun_line_node(line, names, per) or self.head.name

    def session_of(self, label: str) -> str:
        """The inventory node a command label runs on (emulated nodes: the one machine)."""
        return self.head.name if self.emu else label

    def commands(self) -> dict[str, str]:
        """label (node, or emulated node) -> shell command (run from the job dir, tagged with
        the job id)."""
        script = self.script.name if self.script.parent == self.root else str(self.script.relative_to(self.root))
        nodes = self.nodes()
        env = f"export {JOB_VAR}={self.id} MASTER_ADDR={shlex.quote(self.master_addr())} MASTER_PORT={self.port}; "
        if self.emu and self.emu.network:
            env += "export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1; "
        cd = f"cd {shlex.quote(self.job_dir)} && "
        if self.launcher == "torchrun":
            per = self.emu.per_node if self.emu else nodes[0].slots
            argv = launchers.torchrun_cmd(self.python, script, self.args, len(nodes), per,
                                          f"{self.master_addr()}:{self.port}", self.id, self.max_restarts)
            if self.emu and self.emu.devices:
                return {n.name: cd + env + f"export CUDA_VISIBLE_DEVICES={vis}; " + shlex.join(argv)
                        for n, vis in zip(nodes, self.emu.cuda_visible)}
            return {n.name: cd + env + shlex.join(argv) for n in nodes}
        if self.launcher == "deepspeed":
            argv = launchers.deepspeed_cmd(self.python, script, self.args, nodes, self.master_addr(),
                                           self.port, self.ds_launcher,
                                           ssh_port=None if self.emu or self.head.port == 22 else self.head.port,
                                           include=self.emu.include if self.emu else None)
            argv = launchers.fill_hostfile(argv, "hostfile")
            write = f"printf %s {shlex.quote(launchers.hostfile(nodes))} > hostfile && "
            if self.ds_launcher == "openmpi":
                # DeepSpeed's openmpi runner passes no master address to the ranks (launch.py
                # does that for pdsh); it -x exports what .deepspeed_env files hold, read from
                # ~ and then from the cwd, so the job directory's own file adds them
                dse = f"MASTER_ADDR={self.master_addr()}\nMASTER_PORT={self.port}\n"
                write += f"printf %s {shlex.quote(dse)} > .deepspeed_env && "
            return {self.head.name: cd + write + env + shlex.join(argv)}
        if self.launcher == "srun":
            argv = launchers.srun_cmd(self.python, script, self.args, nodes, nodes[0].slots,
                                      {JOB_VAR: self.id, "MASTER_ADDR": self.master_addr(),
                                       "MASTER_PORT": str(self.port)})
            return {self.head.name: cd + shlex.join(argv)}
        if self.launcher == "mpirun":
            argv = launchers.mpirun_cmd(self.python, script, self.args, nodes, self.master_addr(),
                                        self.port, [JOB_VAR] + (["NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE"]
                                                                if self.emu and self.emu.network else []))
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
        results: dict[str, object] = self.results
        threads = []
        for label, cmd in cmds.items():
            s = fleet.sessions[self.session_of(label)]
            s.stage = "train"
            prefix = self.srun_prefix() if self.launcher == "srun" else label
            t = threading.Thread(target=lambda s=s, cmd=cmd, label=label, prefix=prefix: results.__setitem__(
                label, s.run(cmd, stream=True, timeout=(self.timeout or 86400) + 60, label="train",
                             prefix=prefix)),
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
            where = (f"{len(self.emu.names)} emulated node(s) on {self.head.name}" if self.emu
                     else f"{len(self.hosts)} node(s)")
            print(f"train: job {self.id} finished on {where}", file=sys.stderr)
            return 0
        print(f"train: job {self.id} FAILED: {reason}; stopped every rank "
              f"({', '.join(f'{n}: {v}' for n, v in stopped.items())})", file=sys.stderr)
        for n, r in results.items():
            if r.rc != 0 and r.tail():
                print(f"--- last lines from {n}:\n{r.tail(15)}", file=sys.stderr)
        return 130 if reason == "interrupted" else 1


def run(inv, hosts, settings, launcher, payload, args=(), timeout=None, max_restarts=0, port=29500,
        ds_launcher="pdsh", preflight=True, dry_run=False, emulate=0, emulate_network=False) -> int:
    job = Job(inv, hosts, settings, launcher, payload, args, timeout, max_restarts, port,
              ds_launcher, preflight, emulate, emulate_network)
    with Fleet(hosts, settings, "train", job.display) as fleet:
        job.prepare(fleet)
        if dry_run or launcher == "srun":
            cmds = job.commands()
            for node, cmd in cmds.items():
                print(f"{node}: {cmd}")
            if launcher == "srun" and not dry_run:
                head = fleet.sessions[job.head.name]
                r = head.run("command -v srun >/dev/null 2>&1 || exit 3; sinfo -h -o %D", label="srun?")
                if r.rc == 3:
                    raise NodeprepError(f"srun not found on {job.head.name}: no Slurm here; the "
                                        "command above is what would run inside an allocation")
                if r.rc != 0:
                    raise NodeprepError(f"Slurm is not usable from {job.head.name}: "
                                        f"{r.tail(1) or 'sinfo failed'}",
                                        hint="the command above is what would run; on the lab: "
                                             "`invoke lab.up --slurm`")
                return job.launch(fleet)
            return 0
        return job.launch(fleet)
