"""One options object per command, built once from the task's flags (tasks.py) and read by
the command. A new flag: a field here, its flag in tasks.py, and the code that uses it.

tasks.py imports this module for every `invoke` (`--list` and `--help` included), so it
imports only the standard library and nodeprep.errors at its top; what a `validate()` checks
against is imported when it runs (the launchers module stands on the whole inventory layer)."""

from __future__ import annotations

from dataclasses import dataclass

from nodeprep.errors import InputError


@dataclass(frozen=True, kw_only=True)
class FactsOptions:
    inventory: str | None = None  # name under inventory/, a path, hostfile:F, slurm:, pbs:
    limit: str | None = None  # ranges, globs, groups; !x excludes
    json: bool = False


@dataclass(frozen=True, kw_only=True)
class HealthOptions:
    inventory: str | None = None
    limit: str | None = None
    json: bool = False
    checks: tuple[str, ...] = ()  # --check NAME (repeatable); none: every check
    ignore: tuple[str, ...] = ()  # --ignore CODE (repeatable): shown apart, never CRITICAL
    via: str = "auto"  # ssh | slurm | auto: how the probes reach the nodes
    drain: bool = False  # drain CRITICAL nodes in Slurm (reason `nodeprep: ...`)
    undrain: bool = False  # resume nodes nodeprep drained that are healthy now
    deep: bool = False  # also the deep tier: dcgmi diag -r 2, the burn, the all_reduce
    emulate_gpus: int = 0  # the deep tier's burn and all_reduce on N CPU devices (no GPU)
    burn_seconds: float = 10.0  # how long each GPU burns


@dataclass(frozen=True, kw_only=True)
class DoctorOptions:
    inventory: str | None = (
        None  # none: the default inventory if it exists, else the controller only
    )
    limit: str | None = None
    json: bool = False
    checks: tuple[str, ...] = ()  # --check NAME (repeatable); none: every check
    verbose: bool = False  # -v: every check's every subject, OK ones too
    sets: tuple[
        str, ...
    ] = ()  # KEY=VALUE as provision's --set (login_shell=..., controller_ssh_config=...)


@dataclass(frozen=True, kw_only=True)
class PruneOptions:
    config: str = "~/.ssh/config"  # the controller's ssh config
    dry_run: bool = False  # say which blocks would go, change nothing


@dataclass(frozen=True, kw_only=True)
class InitOptions:
    name: str | None = None  # inventory/NAME/hosts.yml is written
    source: str | None = None  # --from: anything --inventory reads, or hosts:LIST
    force: bool = False  # replace an existing inventory NAME
    dry_run: bool = False  # print the file, write nothing
    sets: tuple[str, ...] = ()  # KEY=VALUE the source does not say (user=ops, key=~/.ssh/k)


@dataclass(frozen=True, kw_only=True)
class BandwidthOptions:
    inventory: str | None = None
    limit: str | None = None
    json: bool = False
    quick: bool = False  # one matching, then each suspect against a good node
    png: str | None = None  # a heatmap of the matrix (needs matplotlib)
    seconds: float = 3.0  # each round's send
    port: int = 29511
    tool: str = "auto"  # iperf3 | builtin | auto (iperf3 where every node has it)

    def validate(self) -> None:
        if self.tool not in ("auto", "iperf3", "builtin"):
            raise InputError(f"--tool {self.tool!r}: expected auto, iperf3 or builtin")
        if not 0.2 <= self.seconds <= 60:
            raise InputError(f"--seconds {self.seconds!r}: expected 0.2 to 60")
        if not 1024 <= self.port <= 65535:
            raise InputError(f"--port {self.port!r}: expected 1024 to 65535")


@dataclass(frozen=True, kw_only=True)
class StageOptions:
    inventory: str | None = None
    limit: str | None = None
    src: str | None = None  # a file or directory here (or on FROM_NODE)
    dest: str | None = None  # where it goes on every node (absolute, or ~/...)
    names: tuple[str, ...] = ()  # stages of the inventory's `stages` variable, by name
    from_node: str | None = None  # the node that holds SRC: node to node, never through here
    shard: bool = False  # each node gets its shard by rank, not everything
    verify: bool = False  # hash every staged file on the nodes instead of trusting the record
    relay: bool = True  # chain the nodes (each receives once) where they all get the same
    dry_run: bool = False  # say what would move; move nothing
    json: bool = False

    def validate(self) -> None:
        if self.names and (self.src or self.dest):
            raise InputError("stage: give SRC DEST or --name, not both")
        if not self.names and not (self.src and self.dest):
            raise InputError(
                "stage: SRC and DEST are needed",
                hint="invoke stage data/ /scratch/data, or --name NAME of the inventory's stages",
            )
        if self.dest:
            from nodeprep.ops.stage.spec import check_dest  # the inventory's stages' rule too

            check_dest(self.dest)


@dataclass(frozen=True, kw_only=True)
class ProvisionOptions:
    inventory: str | None = None
    limit: str | None = None
    roles: str | None = None  # comma list (default: all of roles/site.yml)
    check_mode: bool = False  # --check: change nothing; list what would change
    diff: bool = False  # file diffs, secrets redacted
    json: bool = False
    sets: tuple[str, ...] = ()  # KEY=VALUE overrides (YAML values)
    password: str | None = None  # --ask-pass: read by the cli, kept in memory only
    via: str = "auto"  # ssh | slurm | auto (default): slurm inside an allocation
    # holding every node, else ssh
    # (engine/transports/slurmrun.resolve)


@dataclass(frozen=True, kw_only=True)
class VerifyOptions:
    inventory: str | None = None
    limit: str | None = None
    json: bool = False
    deep: bool = False  # re-import torch instead of the node's cached answer
    workdir: str | None = None  # a job directory that must exist on every node
    port: int | None = 29500  # master port that must be free on the head (None: skip)
    baseline: str | None = None  # compare against this fingerprint file
    save_baseline: str | None = None
    mesh: str = "auto"  # auto | full | head
    collective: bool = False  # also an all_reduce across the nodes
    via: str = "auto"  # auto | direct | slurm (auto: slurm inside an allocation
    # holding every node, else the head's logins past 4 nodes)

    def validate(self) -> None:
        if self.mesh not in ("auto", "full", "head"):
            raise InputError(f"--mesh {self.mesh!r}: expected auto, full or head")
        if self.via not in ("auto", "direct", "slurm"):
            raise InputError(f"--via {self.via!r}: expected auto, direct or slurm")


@dataclass(frozen=True, kw_only=True)
class TrainOptions:
    inventory: str | None = None
    limit: str | None = None  # the first node is the head
    launcher: str = "deepspeed"  # one of ops/train/launchers.LAUNCHERS
    payload: str = "health"  # builtin name or a script path
    args: tuple[str, ...] = ()  # the payload's own arguments
    timeout: int | None = None  # seconds before every rank is stopped
    max_restarts: int = 0  # torchrun --max-restarts
    port: int = 29500
    ds_launcher: str = "pdsh"  # DeepSpeed's multinode launcher: pdsh | openmpi
    preflight: bool = True
    dry_run: bool = False
    emulate: int = 0  # pretend the one selected machine is N nodes
    emulate_network: bool = False
    hang_timeout: float | None = None  # no rank output or heartbeat for S s: dump stacks, stop
    ranks: tuple[int, ...] | None = None  # show only these ranks' lines (all are logged)
    detach: bool = False  # run on in the background; train.status/logs/stop
    kill_stale: bool = False  # stop earlier nodeprep jobs still running on the nodes
    health_gate: bool = True  # the passive health checks before the launch
    exclude_unhealthy: bool = False  # launch on the healthy nodes instead of refusing
    health_ignore: tuple[str, ...] = ()  # finding codes the gate does not hold against a node
    container: bool | None = None  # ranks in the inventory's container_image; None: if it is set
    # a run that outlives a bad node (ops/train/restarts.py): relaunches for the whole job,
    # the cause classes retried (none given: causes.RETRIED), the fewest nodes to go on with
    # (None: every node the job started with), arguments added on relaunches only
    restarts: int | None = None  # None: the inventory's train_restarts (commands/train/jobvars)
    retry_on: tuple[str, ...] = ()
    min_nodes: int | None = None
    resume_args: tuple[str, ...] = ()
    spares: str | None = None  # hosts that may replace a quarantined one (default: group spares)
    drain: bool = False  # a node quarantined is also drained in Slurm (commands/train/slurmdrain)
    png: str | None = None  # the job's timeline drawn there at its end (needs matplotlib)
    stages: tuple[str, ...] = ()  # the inventory's stages run on the job's nodes before launch

    def validate(self) -> None:
        from nodeprep.ops.launchenv.dsenv import SUPPORTED_DS_LAUNCHERS
        from nodeprep.ops.train import causes
        from nodeprep.ops.train.launchers import LAUNCHERS

        bad = [c for c in self.retry_on if c not in causes.CLASSES or c in causes.NEVER]
        if bad:
            raise InputError(
                f"--retry-on {bad[0]!r}: expected one of "
                + ", ".join(c for c in causes.CLASSES if c not in causes.NEVER)
            )
        if (self.restarts or 0) < 0 or (self.min_nodes is not None and self.min_nodes < 1):
            raise InputError("--restarts takes 0 or more, --min-nodes 1 or more")
        if self.png and self.detach:
            raise InputError(
                "--png with --detach: the job ends after this command does",
                hint="draw it once the job has ended: invoke train.status RUN --png FILE",
            )
        if self.drain and self.restarts == 0:  # None: the inventory's, checked once read
            raise InputError(
                "--drain: only with --restarts (it drains in Slurm the nodes a relaunch "
                "quarantines)",
                hint="add --restarts N, or use `invoke health --drain`",
            )
        if self.hang_timeout is not None and self.hang_timeout <= 0:
            raise InputError(f"--hang-timeout {self.hang_timeout!r}: expected seconds > 0")
        if self.launcher not in LAUNCHERS:
            raise InputError(
                f"--launcher {self.launcher!r}: expected one of {', '.join(LAUNCHERS)}"
            )
        if self.ds_launcher not in SUPPORTED_DS_LAUNCHERS:
            raise InputError(f"--ds-launcher {self.ds_launcher!r}: expected pdsh or openmpi")
        if self.emulate_network and not self.emulate:
            raise InputError("--emulate-network only applies with --emulate N")


@dataclass(frozen=True, kw_only=True)
class RunsOptions:
    """train.status / train.logs / train.stop."""

    run: str | None = None  # job id (or a unique prefix); default the newest
    node: str | None = None
    rank: int | None = None
    follow: bool = False
    json: bool = False
    png: str | None = None  # train.status: the job's timeline drawn there (needs matplotlib)


@dataclass(frozen=True, kw_only=True)
class ReleaseOptions:
    """train.release: quarantined nodes back in service (none named, not --all: list them)."""

    nodes: tuple[str, ...] = ()
    all: bool = False


@dataclass(frozen=True, kw_only=True)
class TorchPlanOptions:
    torch: str = ""
    nodes: tuple[str, ...] = ()  # NAME:driver=...,gpus=... specs
    modules: tuple[str, ...] = ()  # the modules the fleet loads (a cuda/X.Y one is preferred)
    arch: str | None = None
    index: str | None = None
    json: bool = False
    explain: bool = False  # the table rows and rule steps behind the answer


@dataclass(frozen=True, kw_only=True)
class InventoryOptions:
    inventory: str | None = None
    list: bool = False  # the default view
    graph: bool = False
    host: str | None = None
    json: bool = False


@dataclass(frozen=True, kw_only=True)
class ForgetOptions:
    nodes: str = ""  # names or ranges
    inventory: str | None = None
