"""nodeprep tasks: `invoke --list` shows them, `invoke --help TASK` shows each one's flags.

Argument parsing only: each task builds its command's options object (nodeprep/commands/
options.py) and hands it to the cli layer (nodeprep/cli/), which runs and renders it.
"""

import os
import shlex
import sys
from pathlib import Path

from invoke import Argument, Collection, Exit, Task
from invoke import task as invoke_task

from nodeprep import cli
from nodeprep.commands.options import (
    BandwidthOptions,
    DoctorOptions,
    FactsOptions,
    ForgetOptions,
    HealthOptions,
    InitOptions,
    InventoryOptions,
    ProvisionOptions,
    PruneOptions,
    ReleaseOptions,
    RunsOptions,
    StageOptions,
    TorchPlanOptions,
    TrainOptions,
    VerifyOptions,
)
from nodeprep.settings import Settings

HERE = str(Path(__file__).resolve().parent)


class _Task(Task):
    """Invoke's Task with short flags that cannot be confused: an automatic one is never `-`
    (a dashed name's dash: `--, --kill-stale` beside the `--` before train's payload arguments)
    nor `h` (`TASK -h` is help, as `TASK --help` is); `short={arg: flag}` gives one instead
    (None: none)."""

    def __init__(self, body, short: dict | None = None, **kwargs):
        super().__init__(body, **kwargs)
        self.short = short or {}

    def get_arguments(self, ignore_unknown_help=None):
        """Invoke takes `TASK --help` as the first positional's value and then refuses the
        missing later ones before the task runs; a later positional counts as given when the
        first one is -h/--help, so the task's _help_if_asked shows the help."""
        args = super().get_arguments(ignore_unknown_help)
        positional = [a for a in args if a.positional]
        for later in positional[1:]:
            later.__class__ = _AfterHelp
            later.before = positional[0]
        return args

    def arg_opts(self, name, default, taken_names):
        opts = super().arg_opts(name, default, taken_names | {"-", "h"})
        if name in self.short:
            opts["names"] = opts["names"][:1] + ([self.short[name]] if self.short[name] else [])
        return opts


class _AfterHelp(Argument):
    """A positional after the first (see _Task.get_arguments)."""

    before = None

    @property
    def value(self):
        if self._value is None and self.before is not None and self.before.value in HELP:
            return ""
        return self._value if self._value is not None else self.default

    @value.setter
    def value(self, arg) -> None:
        self.set_value(arg, cast=True)


HELP = ("-h", "--help")


def task(**kwargs):
    return invoke_task(klass=_Task, **kwargs)


def _settings(c, **overrides) -> Settings:
    return Settings.from_mapping(dict(c.config.get("nodeprep", {}))).with_(
        project_root=HERE, **overrides
    )


# the deadlines every task that reaches nodes takes (defaults: invoke.yaml's nodeprep section)
LIVENESS = {
    "connect_timeout": "seconds a silent address gets before it is named unreachable "
    "(default 10; never retried)",
    "silent_after": "seconds a connected node may answer nothing (no TCP ack, no keepalive "
    "reply) before it is named unreachable (default 15)",
}


def _deadlines(c, connect_timeout, silent_after) -> Settings:
    """Settings with --connect-timeout / --silent-after applied (seconds > 0)."""
    out = {}
    for flag, value in (("connect-timeout", connect_timeout), ("silent-after", silent_after)):
        if value is None:
            continue
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if not seconds > 0:
            print(f"error: --{flag} {value!r}: expected seconds > 0", file=sys.stderr)
            raise Exit(code=2)
        out[flag.replace("-", "_")] = seconds
    return _settings(c, **out)


def _done(code: int) -> None:
    if code == 130:
        # Ctrl-C: the cli said what each node was doing and released what it could within its
        # deadline; threads still waiting on a silent node must not hold the exit
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    if code:
        raise Exit(code=code)


@task(
    help={
        "inventory": "inventory name under inventory/, a path, hostfile:F, slurm:[LIST] "
        "or pbs:[F] (default: nodeprep.default_inventory, 'local')",
        "limit": "only these nodes: ranges (worker-[0-3]), globs, groups; !x excludes; or "
        "DeepSpeed's NAME[:SLOTS][@NAME...] (! first: exclude)",
        "json": "print the report as JSON on stdout",
        **LIVENESS,
    }
)
def facts(c, inventory=None, limit=None, json=False, connect_timeout=None, silent_after=None):
    """Show each node's hostname, IP, OS, arch, kernel, python, login shell, GPUs, free disk."""
    _done(
        cli.facts(
            FactsOptions(inventory=inventory, limit=limit, json=json),
            _deadlines(c, connect_timeout, silent_after),
        )
    )


@task(
    positional=["name"],
    help={
        "name": "the new inventory: inventory/NAME/hosts.yml",
        "from": "where the hosts are: sshconfig:PATTERN, a hostfile, slurm:[LIST], pbs:, "
        "an Ansible inventory (groups kept), or hosts:gpu[01-04],login01",
        "force": "replace an existing inventory NAME",
        "dry_run": "print the file, write nothing",
        "set": "KEY=VALUE the source does not say, "
        "e.g. user=ops or key=~/.ssh/id_ed25519 (repeatable)",
        **LIVENESS,
    },
    iterable=["set"],
)
def init(
    c,
    name=None,
    from_=None,
    force=False,
    dry_run=False,
    set=None,
    connect_timeout=None,
    silent_after=None,
):
    """Write a first inventory from what you already have.

    Each node is contacted once; what was learned is written as values and comments (commented
    native YAML), then the next three commands."""
    _help_if_asked("init", name, from_)
    _done(
        cli.init(
            InitOptions(
                name=name, source=from_, force=force, dry_run=dry_run, sets=tuple(set or ())
            ),
            _deadlines(c, connect_timeout, silent_after),
        )
    )


@task(
    iterable=["check", "ignore"],
    help={
        "inventory": "inventory name, a path or PREFIX:ARG (default: nodeprep.default_inventory)",
        "limit": "only these nodes (ranges, globs, groups; !x excludes)",
        "json": "print the findings as JSON on stdout",
        "list_checks": "list every check with its codes and sources, and exit",
        "check": "run only this check (repeatable; names from --list-checks)",
        "ignore": "a finding code to show apart and never hold against a node (repeatable)",
        "via": "ssh, slurm (the probes as srun steps through the first node) or auto (default: "
        "slurm inside an allocation holding every node)",
        "drain": "drain each CRITICAL node in Slurm, reason 'nodeprep: CODES'; a node someone "
        "else drained keeps its reason",
        "undrain": "return to service the nodes nodeprep drained that are healthy now (never "
        "one drained for another reason)",
        "deep": "also the deep tier (minutes): dcgmi diag -r 2, a GPU burn, an all_reduce over "
        "each node's GPUs against its model's floor",
        "emulate_gpus": "the deep tier's burn and all_reduce on N CPU devices where a node has no "
        "GPU (to see the tier work; its figures say nothing of a GPU)",
        "burn_seconds": "seconds each GPU burns in the deep tier (default 10)",
        **LIVENESS,
    },
)
def health(
    c,
    inventory=None,
    limit=None,
    json=False,
    list_checks=False,
    check=None,
    ignore=None,
    via="auto",
    drain=False,
    undrain=False,
    deep=False,
    emulate_gpus=None,
    burn_seconds=None,
    connect_timeout=None,
    silent_after=None,
):
    """Check that every node is fit to run a job; exit 1 on a CRITICAL finding.

    GPUs (ECC, row remap, PCIe, clocks, NVLink, Xids), disk, memory, /dev/shm, limits, clock,
    RDMA ports, the job network."""
    _done(
        cli.health(
            HealthOptions(
                inventory=inventory,
                limit=limit,
                json=json,
                checks=tuple(check or ()),
                ignore=tuple(ignore or ()),
                via=via,
                drain=drain,
                undrain=undrain,
                deep=deep,
                emulate_gpus=_number("--emulate-gpus", emulate_gpus, int) or 0,
                burn_seconds=_number("--burn-seconds", burn_seconds, float) or 10.0,
            ),
            _deadlines(c, connect_timeout, silent_after),
            list_checks=list_checks,
        )
    )


@task(
    iterable=["check", "set"],
    help={
        "inventory": "inventory name, a path or PREFIX:ARG "
        "(default: nodeprep.default_inventory, if it exists; else the controller only)",
        "limit": "only these nodes (ranges, globs, groups; !x excludes)",
        "json": "print every check's findings as JSON on stdout",
        "list_checks": "list every check with its codes, and exit",
        "check": "run only this check (repeatable; names from --list-checks)",
        "verbose": "show every check's line for every node, OK ones too",
        "set": "KEY=VALUE as for provision (repeatable), e.g. login_shell=/bin/zsh",
        **LIVENESS,
    },
)
def doctor(
    c,
    inventory=None,
    limit=None,
    json=False,
    list_checks=False,
    check=None,
    verbose=False,
    set=None,
    connect_timeout=None,
    silent_after=None,
):
    """Say what is wrong and the command that fixes it; exit 1 on any finding.

    The controller (keys, agent, ssh config blocks and aliases, labs, Python and pins) and first
    contact with the nodes (reach, auth, host key, sudo, python, launchers on the
    non-interactive PATH, disk)."""
    _done(
        cli.doctor(
            DoctorOptions(
                inventory=inventory,
                limit=limit,
                json=json,
                checks=tuple(check or ()),
                verbose=verbose,
                sets=tuple(set or ()),
            ),
            _deadlines(c, connect_timeout, silent_after),
            list_checks=list_checks,
        )
    )


@task(
    help={
        "config": "the controller's ssh config (default ~/.ssh/config)",
        "dry_run": "say which blocks would go; change nothing",
    }
)
def ssh_prune(c, config="~/.ssh/config", dry_run=False):
    """Remove the managed ~/.ssh/config blocks whose inventory no longer exists.

    User entries and other blocks are kept byte for byte."""
    _done(cli.ssh_prune(PruneOptions(config=config, dry_run=dry_run), _settings(c)))


@task(
    help={
        "inventory": "inventory name, a path or PREFIX:ARG (default: nodeprep.default_inventory)",
        "limit": "only these nodes (at least two)",
        "json": "print the matrix and the flagged nodes as JSON on stdout",
        "quick": "one round of disjoint pairs, then each suspect against a known-good node "
        "(default: every ordered pair, N-1 rounds)",
        "png": "also write the matrix as a heatmap PNG (needs matplotlib)",
        "seconds": "seconds each node sends per round (default 3)",
        "port": "TCP port the nodes listen on (default 29511)",
        "tool": "iperf3, builtin (a standard-library sender) or auto (default: iperf3 where every "
        "node has it)",
        **LIVENESS,
    }
)
def bandwidth(
    c,
    inventory=None,
    limit=None,
    json=False,
    quick=False,
    png=None,
    seconds=None,
    port=None,
    tool="auto",
    connect_timeout=None,
    silent_after=None,
):
    """Measure TCP bandwidth and latency between every pair of nodes; exit 1 when one is flagged.

    Every node sends and receives at once, in rounds; the node common to the slow pairs is
    named."""
    _done(
        cli.bandwidth(
            BandwidthOptions(
                inventory=inventory,
                limit=limit,
                json=json,
                quick=quick,
                png=png,
                seconds=_number("--seconds", seconds, float) or 3.0,
                port=_number("--port", port, int) or 29511,
                tool=tool,
            ),
            _deadlines(c, connect_timeout, silent_after),
        )
    )


@task(
    help={
        "nodes": "how many emulated nodes (worker-0 .. worker-N-1)",
        "name": "lab name (<= 6 chars); 'local' writes inventory/local/",
        "slurm": "also run a real Slurm over the nodes (slurmctld + munged here, slurmd in "
        "each node) for `train --launcher srun`; kept by later lab.up runs",
        "no_slurm": "stop the lab's Slurm",
        "shared_home": "one home bind-mounted into every node, as an NFS home (kept by later "
        "lab.up runs; changing it needs lab.down first)",
        "private_homes": "a home of its own per node (the default)",
        "aliases": "K more inventory nodes that reach the first K nodes' machines again "
        "(two inventory names, one machine)",
        "nic_names": "comma list of interface names the nodes get in turn (eno1,eth0: "
        "differing NIC names; '-' for eth0 everywhere); kept by later lab.up runs",
        "no_sudo": "comma list of node indices whose user may not sudo (this lab.up)",
        "link_rate": "limit each node's link both ways (tc on its veth), e.g. 200mbit; none "
        "removes it; kept by later lab.up runs",
        "gpu_record": "DIR or NODE=DIR (repeatable): a stand-in nvidia-smi answering from a real "
        "machine's recording (DIR/nvidia-smi-q.xml ...; docs/lab.md); none drops it; "
        "kept by later lab.up runs",
        "bastion": "a jump host in front (10.X.0.5): the nodes then refuse the controller, "
        "and the inventory says proxy_jump; kept by later lab.up runs",
        "no_bastion": "remove the jump host",
        "containers": "podman on the nodes, rootless for the lab user (docs/containers.md); "
        "kept by later lab.up runs",
        "no_containers": "no container engine set up on the nodes",
        "modules": "lmod or tcl: environment modules on the nodes (Lmod 8.6 or Environment "
        "Modules 5.2, Debian's) and the lab's module tree (python/3.11, cuda/12.6, cuda/12.4; "
        "docs/lab.md); none drops them; kept by later lab.up runs",
        "arch": "aarch64 (every node) or NODE=aarch64 (repeatable): nodes whose userland is an "
        "arm64 Debian root run through qemu-user (docs/lab.md); native sets one back; "
        "kept by later lab.up runs, changing it needs lab.down first",
    },
    iterable=["gpu_record", "arch"],
    short={"shared_home": "H", "no_sudo": None},
)
def lab_up(
    c,
    nodes=2,
    name="local",
    slurm=False,
    no_slurm=False,
    shared_home=False,
    private_homes=False,
    aliases=0,
    nic_names=None,
    no_sudo="",
    link_rate=None,
    gpu_record=None,
    bastion=False,
    no_bastion=False,
    arch=None,
    containers=False,
    no_containers=False,
    modules=None,
):
    """Start (or resize) the emulated cluster: one netns, sshd and home per node."""
    nics = (
        None if nic_names is None else tuple(n for n in nic_names.split(",") if n not in ("", "-"))
    )
    _done(
        cli.lab_up(
            int(nodes),
            name,
            _settings(c),
            slurm=True if slurm else (False if no_slurm else None),
            shared_home=True if shared_home else (False if private_homes else None),
            aliases=int(aliases),
            nic_names=nics,
            no_sudo=tuple(int(i) for i in str(no_sudo).split(",") if i.strip().isdigit()),
            link_rate=None if link_rate is None else str(link_rate),
            gpu_records=tuple(gpu_record) if gpu_record else None,
            bastion=True if bastion else (False if no_bastion else None),
            arch=tuple(arch) if arch else None,
            containers=True if containers else (False if no_containers else None),
            modules=None if modules is None else ("" if modules == "none" else str(modules)),
        )
    )


@task(help={"name": "lab name", "purge": "also delete node homes and host keys"})
def lab_down(c, name="local", purge=False):
    """Stop the emulated cluster; leaves no process, namespace or mount behind."""
    _done(cli.lab_down(name, purge, _settings(c)))


@task(help={"name": "lab name"})
def lab_status(c, name="local"):
    """List the lab's nodes and whether their sshd runs."""
    _done(cli.lab_status(name, _settings(c)))


@task(
    help={
        "nodes": "node names or ranges whose pinned keys to drop",
        "inventory": "inventory (default: local)",
    }
)
def hosts_forget(c, nodes, inventory=None):
    """Forget pinned host keys after a deliberate node reinstall (next contact re-pins)."""
    _help_if_asked("hosts.forget", nodes, inventory)
    _done(cli.hosts_forget(ForgetOptions(nodes=nodes, inventory=inventory), _settings(c)))


@task(
    name="inventory",
    help={
        "inventory": "inventory name, path or PREFIX:ARG (hostfile:, ini:, pbs:, slurm:, "
        "sshconfig:, yaml:); default: nodeprep.default_inventory",
        "list": "every host with address, port, user, connection, groups (the default)",
        "graph": "the group tree",
        "host": "every variable of one host with the file:line it came from",
        "json": "print as JSON",
    },
    short={"host": "H"},
)
def inventory_(c, inventory=None, list=False, graph=False, host=None, json=False):
    """Show what nodeprep reads from an inventory, without contacting any node.

    Ansible INI/YAML, native YAML, hostfiles, nodefiles, Slurm lists, ~/.ssh/config."""
    _done(
        cli.inventory(
            InventoryOptions(inventory=inventory, list=list, graph=graph, host=host, json=json),
            _settings(c),
        )
    )


@task(
    iterable=["set"],
    help={
        "inventory": "inventory name or path (default: nodeprep.default_inventory)",
        "roles": "comma list of roles to apply (default: all of roles/site.yml, in order)",
        "limit": "only these nodes: ranges, globs, groups; !x excludes; or DeepSpeed's "
        "NAME[:SLOTS][@NAME...]",
        "check": "change nothing; list what would change",
        "diff": "show file diffs (secrets redacted)",
        "json": "print the report as JSON on stdout",
        "ask_pass": "log in with a password where the key is not installed yet (asked once, "
        "kept in memory only)",
        "set": "KEY=VALUE variable override (YAML value), highest precedence; repeatable",
        "via": "ssh: a connection from here to every node; slurm: one ssh connection, to the "
        "first node, whose srun runs each stage's scripts on all nodes as one step "
        "(sbcast carries them); auto (default): slurm inside an allocation holding "
        "every node, else ssh",
        **LIVENESS,
    },
)
def provision(
    c,
    inventory=None,
    roles=None,
    limit=None,
    check=False,
    diff=False,
    json=False,
    ask_pass=False,
    set=None,
    via="auto",
    connect_timeout=None,
    silent_after=None,
):
    """Prepare every node the same way: the roles of roles/site.yml; idempotent."""
    _done(
        cli.provision(
            ProvisionOptions(
                inventory=inventory,
                limit=limit,
                roles=roles,
                check_mode=check,
                diff=diff,
                json=json,
                sets=tuple(set or ()),
                via=via,
            ),
            _deadlines(c, connect_timeout, silent_after),
            ask_pass=ask_pass,
        )
    )


@task(
    help={
        "inventory": "inventory name or path (default: nodeprep.default_inventory)",
        "limit": "only these nodes: ranges, globs, groups; !x excludes; or DeepSpeed's "
        "NAME[:SLOTS][@NAME...]",
        "json": "print {ok, drift, unreachable, checks} as JSON",
        "deep": "re-import torch on every node instead of using its cached answer",
        "workdir": "job directory that must exist on every node (the launchers cd into it)",
        "port": "master port that must be free on the head node (0: skip)",
        "baseline": "report what changed since this fingerprint file",
        "save_baseline": "write the fleet's fingerprint to this file",
        "mesh": "real ssh logins: full (every ordered pair), head (head -> every node), "
        "auto (full up to 4 nodes, else head; default); every pair is also "
        "checked on paper",
        "collective": "also run an all_reduce across the nodes via torchrun (gloo on CPU, "
        "nccl on GPU) and report bus bandwidth per message size",
        "via": "auto (default): when only the head logs in to every node, the probes ride "
        "those logins (one connection from here); direct: connect from here to "
        "every node (also proves this machine reaches each one); slurm: the probes run "
        "as one srun step from the first node (auto picks it inside an allocation "
        "holding every node)",
        **LIVENESS,
    }
)
def verify_parity(
    c,
    inventory=None,
    limit=None,
    json=False,
    deep=False,
    workdir=None,
    port=29500,
    baseline=None,
    save_baseline=None,
    mesh="auto",
    collective=False,
    via="auto",
    connect_timeout=None,
    silent_after=None,
):
    """Prove the nodes are the same where training cares; show drift grouped by value."""
    _done(
        cli.verify_parity(
            VerifyOptions(
                inventory=inventory,
                limit=limit,
                json=json,
                deep=deep,
                workdir=workdir,
                port=int(port) or None,
                baseline=baseline,
                save_baseline=save_baseline,
                mesh=mesh,
                collective=collective,
                via=via,
            ),
            _deadlines(c, connect_timeout, silent_after),
        )
    )


@task(
    positional=["src", "dest"],
    help={
        "src": "a file or directory here (with --from: on that node)",
        "dest": "where on every node: absolute, or ~/... (a directory: SRC's files go in it)",
        "inventory": "inventory name or path (default: nodeprep.default_inventory)",
        "limit": "only these nodes (with --shard, their ranks follow the inventory's order)",
        "name": "a stage of the inventory's `stages` variable instead of SRC DEST (repeatable)",
        "from": "the node that already holds SRC: node to node, never through the controller",
        "shard": "each node gets its share by rank (file i goes to rank i mod N), not all",
        "verify": "hash every staged file on the nodes instead of trusting the record "
        "(size, inode, ctime)",
        "no_relay": "a stream per node from the source instead of one chain through them",
        "dry_run": "say what each node lacks; move nothing",
        "json": "the outcome as JSON on stdout",
        **LIVENESS,
    },
    iterable=["name"],
)
def stage(
    c,
    src=None,
    dest=None,
    inventory=None,
    limit=None,
    name=None,
    from_=None,
    shard=False,
    verify=False,
    no_relay=False,
    dry_run=False,
    json=False,
    connect_timeout=None,
    silent_after=None,
):
    """Put a dataset, tokenizer or checkpoint on every node's local disk (docs/staging.md).

    Chunks checked by sha256 as they land, resumed after an interruption, room checked first;
    a second run moves nothing."""
    _help_if_asked("stage", src, dest)
    _done(
        cli.stage(
            StageOptions(
                inventory=inventory,
                limit=limit,
                src=src,
                dest=dest,
                names=tuple(name or ()),
                from_node=from_,
                shard=shard,
                verify=verify,
                relay=not no_relay,
                dry_run=dry_run,
                json=json,
            ),
            _deadlines(c, connect_timeout, silent_after),
        )
    )


@task(
    help={
        "inventory": "inventory name or path (default: nodeprep.default_inventory)",
        "limit": "only these nodes (the first one is the head node); DeepSpeed's "
        "NAME[:SLOTS][@NAME...] picks GPUs too (! first: exclude)",
        "launcher": "deepspeed (default), torchrun, mpirun or srun",
        "payload": "builtin health or ddp, or a script path (its directory is synced)",
        "timeout": "seconds before every rank is stopped (default: none)",
        "max_restarts": "torchrun --max-restarts (elastic restarts from the payload's snapshot)",
        "port": "master / rendezvous port on the head node",
        "ds_launcher": "DeepSpeed's multinode launcher: pdsh (default) or openmpi",
        "no_preflight": "skip the checks that catch hangs before launch",
        "dry_run": "print each node's command and stop",
        "emulate": "pretend the one selected machine is N nodes (ssh aliases emu-0.., its GPUs "
        "split between them)",
        "emulate_network": "with --emulate: NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 (traffic over "
        "the network path)",
        "hang_timeout": "seconds without output or heartbeat from any rank before every rank's "
        "Python stack is dumped and the job stopped (default: off)",
        "ranks": "show only these ranks' lines, e.g. 0 or 0,3 (every rank is still logged)",
        "detach": "start the job and return: it runs on without this terminal "
        "(train.status, train.logs, train.stop)",
        "kill_stale": "stop earlier nodeprep jobs still running on the nodes before launching",
        "no_health_gate": "launch without the passive health checks (docs/health.md)",
        "exclude_unhealthy": "launch on the healthy nodes, "
        "leaving out those with a CRITICAL finding",
        "health_ignore": "a health finding code the gate does not hold against a node (repeatable)",
        "container": "run every rank in the inventory's container_image (the default when it "
        "is set; docs/containers.md)",
        "no_container": "run on the nodes' venvs even though the inventory names an image",
        "restarts": "relaunch after a failure up to N times for the whole job, without the node "
        "it blames (quarantined: invoke train.release); default: the inventory's train_restarts, "
        "as train_retry_on, train_min_nodes, train_resume_args for the next three; docs/train.md",
        "retry_on": "a failure class to relaunch after (repeatable; default hardware, node, "
        "hang, killed; also user, launcher, timeout)",
        "min_nodes": "with --restarts: go on with fewer nodes, down to N (default: all of them)",
        "resume_args": "arguments added to the payload's on relaunches only, e.g. '--resume'",
        "spares": "hosts that may take a quarantined node's place (default: the inventory's "
        "group `spares`; never among the job's first nodes)",
        "png": "at the job's end, draw its timeline (attempts, nodes, failures) to this PNG "
        "(needs matplotlib)",
        "stage": "a stage of the inventory's `stages` run on the job's nodes before launch "
        "(repeatable; sharded by the job's ranks; docs/staging.md)",
        "drain": "with --restarts: drain each node it quarantines in Slurm too, as `invoke "
        "health --drain` does (reason nodeprep: QUARANTINED); health --undrain returns it "
        "once released",
        **LIVENESS,
    },
    iterable=["health_ignore", "retry_on", "stage"],
    short={"kill_stale": "K", "hang_timeout": "H"},
)
def train(
    c,
    inventory=None,
    limit=None,
    launcher="deepspeed",
    payload="health",
    timeout=None,
    max_restarts=None,
    port=None,
    ds_launcher="pdsh",
    no_preflight=False,
    dry_run=False,
    emulate=None,
    emulate_network=False,
    hang_timeout=None,
    ranks=None,
    detach=False,
    kill_stale=False,
    no_health_gate=False,
    exclude_unhealthy=False,
    health_ignore=None,
    connect_timeout=None,
    silent_after=None,
    container=False,
    no_container=False,
    restarts=None,
    retry_on=None,
    min_nodes=None,
    resume_args=None,
    spares=None,
    drain=False,
    png=None,
    stage=None,
):
    """Start the payload on every node; stop every rank everywhere if one fails.

    With --hang-timeout, also when one hangs. Payload arguments go after `--`:
    invoke train --payload ddp -- --epochs 3"""
    args = sys.argv[sys.argv.index("--") + 1 :] if "--" in sys.argv else []
    shown = None
    if ranks is not None:
        shown = tuple(_number("--ranks", r, int) for r in str(ranks).split(",") if r.strip())
    _done(
        cli.train(
            TrainOptions(
                inventory=inventory,
                limit=limit,
                launcher=launcher,
                payload=payload,
                args=tuple(args),
                timeout=_number("--timeout", timeout, int) or None,
                max_restarts=_number("--max-restarts", max_restarts, int) or 0,
                port=_number("--port", port, int) or 29500,
                ds_launcher=ds_launcher,
                preflight=not no_preflight,
                dry_run=dry_run,
                emulate=_number("--emulate", emulate, int) or 0,
                emulate_network=emulate_network,
                hang_timeout=_number("--hang-timeout", hang_timeout, float) or None,
                ranks=shown,
                detach=detach,
                kill_stale=kill_stale,
                health_gate=not no_health_gate,
                exclude_unhealthy=exclude_unhealthy,
                health_ignore=tuple(health_ignore or ()),
                container=True if container else (False if no_container else None),
                restarts=None if restarts is None else _number("--restarts", restarts, int),
                retry_on=tuple(retry_on or ()),
                min_nodes=None if min_nodes is None else _number("--min-nodes", min_nodes, int),
                resume_args=_words("--resume-args", resume_args),
                spares=spares,
                drain=drain,
                png=png,
                stages=tuple(stage or ()),
            ),
            _deadlines(c, connect_timeout, silent_after),
        )
    )


def _number(flag: str, value, kind):
    """A numeric flag's value (flags default to None so Invoke hands over the text): a bad
    one is a one-line error, exit 2, not Invoke's traceback."""
    if value is None:
        return None
    try:
        return kind(value)
    except ValueError:
        raise Exit(
            f"error: {flag} {value!r}: expected a {'whole ' if kind is int else ''}number", code=2
        )


def _help_if_asked(name: str, *values) -> None:
    """Invoke takes `--help` after a task with a positional argument as that argument's value:
    show the task's help instead (exit 0), as `invoke --help NAME` does."""
    if any(v in ("-h", "--help") for v in values):
        sys.stdout.flush()
        os.execv(
            sys.executable,
            [
                sys.executable,
                "-m",
                "invoke",
                "-r",
                str(Path(__file__).resolve().parent),
                "--help",
                name,
            ],
        )


def _words(flag: str, text):
    """TEXT split as a shell splits it (a quote left open: exit 2)."""
    try:
        return tuple(shlex.split(text or ""))
    except ValueError as e:
        raise Exit(f"error: {flag} {text!r}: {e}", code=2) from None


def _run_id(run):
    """RUN as the user typed it; `last` (or `latest`) is the newest run."""
    return None if run in ("last", "latest") else run


@task(
    positional=["run"],
    help={
        "run": "run id, or `last` for the newest",
        "json": "print the status as JSON",
        "png": "draw the job's timeline (attempts, nodes, failures) to this PNG (needs matplotlib)",
    },
)
def train_status(c, run=None, json=False, png=None):
    """A training run's state per node: ranks alive, last line, elapsed; checked on the nodes."""
    _help_if_asked("train.status", run)
    _done(cli.train_status(RunsOptions(run=_run_id(run), json=json, png=png), _settings(c)))


@task(
    positional=["run"],
    help={
        "run": "run id, or `last` for the newest",
        "node": "only this node's logs",
        "rank": "only this rank's logs",
        "follow": "keep printing until the run ends",
    },
)
def train_logs(c, run=None, node=None, rank=None, follow=False):
    """A training run's logs: per node and rank, launcher output, stack dumps."""
    _help_if_asked("train.logs", run, node, rank)
    _done(
        cli.train_logs(
            RunsOptions(
                run=_run_id(run), node=node, rank=_number("--rank", rank, int), follow=follow
            ),
            _settings(c),
        )
    )


@task(positional=["run"], help={"run": "run id (required)"})
def train_stop(c, run=None):
    """Stop a (detached) training run: every rank on every node."""
    _help_if_asked("train.stop", run)
    _done(cli.train_stop(RunsOptions(run=run), _settings(c)))


@task(
    iterable=["node"],
    help={
        "node": "a quarantined node to put back in service (repeatable; none: list them)",
        "all": "every quarantined node",
    },
)
def train_release(c, node=None, all=False):
    """Put nodes `train --restarts` quarantined back in service; without --node, list them."""
    _done(cli.train_release(ReleaseOptions(nodes=tuple(node or ()), all=all), _settings(c)))


@task(
    iterable=["node", "module"],
    help={
        "torch": "torch release, e.g. 2.5.1 or 2.13.0",
        "node": "NAME:driver=535.104.05,gpus=8x8.0 (or gpu=8.0+9.0, gpu=A100, arch=aarch64), "
        "or NAME:cpu; repeatable",
        "module": "a module the fleet loads, as the inventory's `modules` (repeatable): a CUDA "
        "toolkit module (cuda/12.6) makes its variant (cu126) the pick where it fits",
        "arch": "CPU arch of nodes that do not say (default x86_64)",
        "index": "index URL template with {variant} (default the PyTorch index)",
        "json": "print the plan (or the error) as JSON",
        "explain": "also print the table rows and rule steps that led to the answer, with sources",
    },
)
def torch_plan(c, torch, node=None, module=None, arch=None, index=None, json=False, explain=False):
    """Say which torch build fits a fleet, without touching any node.

    Per CPU platform: the variant, the exact pin and index, or the node that blocks and how to
    fix it."""
    _help_if_asked("torch-plan", torch, arch, index, *(node or ()), *(module or ()))
    _done(
        cli.torch_plan(
            TorchPlanOptions(
                torch=torch,
                nodes=tuple(node or ()),
                modules=tuple(module or ()),
                arch=arch,
                index=index,
                json=json,
                explain=explain,
            )
        )
    )


@task(help={"nodes": "emulated nodes to start", "keep": "leave the lab running afterwards"})
def demo(c, nodes=2, keep=True):
    """Run the main job end to end on the emulated lab.

    lab.up, facts, provision (twice: the second run must change nothing), verify-parity, then
    train: the health payload with the DeepSpeed launcher and the ddp payload with torchrun."""
    s = _settings(c)
    _done(cli.lab_up(int(nodes), "local", s))
    _done(cli.facts(FactsOptions(inventory="local"), s))
    _done(cli.provision(ProvisionOptions(inventory="local"), s))
    _done(cli.provision(ProvisionOptions(inventory="local"), s))
    _done(cli.verify_parity(VerifyOptions(inventory="local"), s))
    _done(
        cli.train(
            TrainOptions(inventory="local", launcher="deepspeed", payload="health", timeout=300), s
        )
    )
    _done(
        cli.train(
            TrainOptions(
                inventory="local",
                launcher="torchrun",
                payload="ddp",
                timeout=300,
                args=("--epochs", "2", "--steps-per-epoch", "4"),
            ),
            s,
        )
    )
    if not keep:
        _done(cli.lab_down("local", False, s))


TIERS = (
    "lab",
    "slurm",
    "aarch64",
    "cold",
    "train",
)  # markers: tests/conftest.py says which test is which


@task(
    iterable=["tier"],
    help={
        "k": "only tests matching this expression (pytest -k)",
        "unit": "unit tests only (no root, no sshd needed)",
        "fast": "the fast tier: unit tests not marked slow (no torch, ansible, downloads or "
        "fuzz campaign; see tests/unit/conftest.py), under a minute",
        "tier": "only the integration tests of this tier (repeatable): " + ", ".join(TIERS),
        "workers": "pytest-xdist workers (default: 2 for the unit tests, none for the lab tests, "
        "whose deadline tests need the cores; 0: one process, as a debugger needs)",
    },
)
def test(c, k=None, unit=False, fast=False, tier=None, workers=None):
    """Run the test suite: unit tests, then integration tests against a real emulated lab."""
    bad = [t for t in tier or () if t not in TIERS]
    if bad:
        raise Exit(f"error: --tier {bad[0]!r}: expected one of {', '.join(TIERS)}", code=2)
    if workers is not None and not str(workers).isdigit():
        raise Exit(
            f"error: --workers {workers!r}: expected a whole number (0: one process)", code=2
        )
    env = {"PYTHONDONTWRITEBYTECODE": "1"}
    if tier:
        runs = [(["tests/integration", "-m", " or ".join(tier)], 0)]
    elif unit or fast:
        runs = [(["tests/unit"] + (["-m", "not slow"] if fast else []), 2)]
    else:
        # the whole suite in two runs: the unit tier test by test on 2 workers (independent,
        # CPU-bound tests), then the lab tier in one process (its deadline tests need the
        # cores); the arm64 root the lab tier needs builds beside the unit tier
        runs = [(["tests/unit"], 2), (["tests/integration"], 0)]
        env["NODEPREP_TEST_PREBUILD"] = "aarch64"
    failed = False
    for args, default in runs:
        n = int(default if workers is None else workers)
        # on workers: unit tests one by one; lab modules one per worker, each worker with its
        # own lab (tests/conftest.py), in the order tests/conftest.py sets
        dist = (
            ["--dist", "load"]
            if "tests/unit" in args
            else ["--dist", "loadscope", "--no-loadscope-reorder"]
        )
        args = args + (["-k", k] if k else []) + (["-n", str(n), *dist] if n else [])
        # --durations: the slowest tests in every CI log (the suite must stay under 15 minutes)
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--durations=25",
        ] + args
        failed |= c.run(" ".join(shlex.quote(a) for a in cmd), pty=False, env=env, warn=True).failed
    if failed:
        raise Exit("error: tests failed (above)", code=1)


lab = Collection("lab")
lab.add_task(lab_up, "up")
lab.add_task(lab_down, "down")
lab.add_task(lab_status, "status")
hosts = Collection("hosts")
hosts.add_task(hosts_forget, "forget")
ssh = Collection("ssh")
ssh.add_task(ssh_prune, "prune")
train_ns = Collection("train")
train_ns.add_task(train, "run", default=True)
train_ns.add_task(train_status, "status")
train_ns.add_task(train_logs, "logs")
train_ns.add_task(train_stop, "stop")
train_ns.add_task(train_release, "release")
ns = Collection(
    init,
    doctor,
    facts,
    health,
    bandwidth,
    inventory_,
    provision,
    verify_parity,
    stage,
    torch_plan,
    demo,
    test,
    lab,
    hosts,
    ssh,
    train_ns,
)
