"""The container way of `train` (issue 45): on every node one container of the job (ops/container/
run.NodeContainer), started before the launch and removed after it, whatever the end; every
rank runs inside it, under the launcher the user chose. Pure: shell text and argv lists.

Where each launcher runs:
  torchrun   inside each node's container (its own rendezvous client, as on the host)
  deepspeed  inside each node's container as `python3 -m deepspeed.launcher.runner --no_ssh
             --node_rank I`: no pdsh, no ssh into a container (DeepSpeed issues 4387, 2920)
  mpirun     on the head's host, as Open MPI starts its daemons over ssh; each rank is
  srun       `ENGINE exec ... python3 -u rank.py ...` into its node's container (as pyxis runs
             Slurm tasks in containers)
The watcher (nodeside/watch.py) and stack dumps run inside the container too: the ranks' process
ids are the container's (no --pid host: it needs a cgroup per container, which not every
rootless setup gives).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from nodeprep.engine.facts import CONTAINER, GPUS, RDMA_PORTS, USER
from nodeprep.engine.facts.jobs import JOB_VAR, RESTART_VAR
from nodeprep.ops.container import readiness
from nodeprep.ops.container.run import NodeContainer, shell

PYTHON = "python3"  # the image's interpreter, found on the image's own PATH
# variables each rank gets from the launcher, passed into the container by name
RANK_ENV = (
    JOB_VAR,
    RESTART_VAR,
    "HOME",
    "NODEPREP_NODE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "CUDA_VISIBLE_DEVICES",
    "NCCL_P2P_DISABLE",
    "NCCL_SHM_DISABLE",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "OMPI_COMM_WORLD_NODE_RANK",
    "PMIX_RANK",
    "PMI_RANK",
    "PMI_SIZE",
    "MPI_LOCALRANKID",
    "MPI_LOCALNRANKS",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NODEID",
    "SLURM_NTASKS",
    "SLURM_NPROCS",
    "SLURM_NNODES",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "SLURM_JOB_NODELIST",
    "SLURM_STEP_NODELIST",
    "SLURM_TASKS_PER_NODE",
)
# variables a launcher started in the container gets from outside (the job, its home, its node)
LAUNCH_ENV = (JOB_VAR, "HOME", "NODEPREP_NODE")
# the host's paths mean nothing in the image: ~/.deepspeed_env's lines for them stay outside
HOST_PATHS = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
ENV_FILE = "container.env"  # in the run directory on the node


@dataclass(frozen=True)
class JobContainers:
    """The job's container on each node (NODES: node -> NodeContainer) and the variables from
    the inventory's container_env (ENV) that every rank gets besides ~/.deepspeed_env's."""

    nodes: dict[str, NodeContainer]
    env: tuple[tuple[str, str], ...] = ()

    def of(self, node: str) -> NodeContainer:
        return self.nodes[node]

    def start(self, node: str) -> str:
        """sh: the env file (mode 600: ~/.deepspeed_env holds secrets) from ~/.deepspeed_env
        without the host's paths, then ENV; then the container, detached."""
        path = shlex.quote(self.of(node).env_file or "")
        lines = "".join(f"{k}={v}\n" for k, v in self.env)
        drop = "|".join(HOST_PATHS)
        return (
            f'umask 077 && mkdir -p "$(dirname {path})" && '
            f"{{ grep -Ev '^({drop})=' \"$HOME/.deepspeed_env\" 2>/dev/null; "
            f"printf %s {shlex.quote(lines)}; }} > {path} && {{ "
            + shell(self.of(node).start())
            # the engine reads the file when it creates the container: it goes right after
            + f" >/dev/null; np_rc=$?; rm -f {path}; exit $np_rc; }}"
        )

    def remove(self, node: str) -> str:
        return shell(self.of(node).remove()) + " >/dev/null 2>&1; true"

    def leftovers(self, node: str) -> str:
        return shell(self.of(node).leftovers())

    def exec_argv(self, node: str, extra: tuple[str, ...] = ()) -> list[str]:
        return self.of(node).exec([], RANK_ENV + tuple(extra))

    def wrap(self, node: str, command: str) -> str:
        """COMMAND (sh text: it exports what the launcher needs) run by sh inside NODE's
        container; the launcher in it gives its ranks the rest."""
        return shell(self.of(node).exec([], LAUNCH_ENV) + ["sh", "-c", command])

    def rank_prefix(self, head: str) -> tuple[str, ...]:
        """What mpirun and srun put before each rank's interpreter: the exec into the job's
        container of whichever node the rank lands on (the same name and engine everywhere)."""
        return tuple(self.exec_argv(head))


def deepspeed_node(argv: list[str], node_rank: int, script: str) -> list[str]:
    """A `deepspeed -H ... --launcher L ... SCRIPT ARGS` ARGV as the per-node launch inside a
    container: the image's runner module, --no_ssh --node_rank NODE_RANK instead of a multinode
    launcher (and its --ssh_port); SCRIPT and what follows it are the payload's, kept as given."""
    cut = argv.index(script)
    out = [PYTHON, "-m", "deepspeed.launcher.runner", "--no_ssh", f"--node_rank={node_rank}"]
    rest = iter(argv[1:cut])
    for a in rest:
        if a in ("--launcher", "--ssh_port"):
            next(rest, None)  # and its value
        else:
            out.append(a)
    return out + argv[cut:]


def image_id(spec, archive_image, engine_fact: dict) -> str | None:
    """The ID of the image SPEC names as the node holds it: an archive's own ID (the node must
    hold it), or the ID the node's engine gives the registry reference; None: not there."""
    held = engine_fact.get("images") or []
    if archive_image is not None:
        want = archive_image.id
        return want if any(i["id"] == want for i in held) else None
    names = {spec.image.ref, spec.image.qualified}
    digest = spec.image.digest
    for i in held:
        if (digest and i.get("digest") == digest) or (not digest and i.get("name") in names):
            return i["id"]
    return None


def _ready(n, nodes, f: dict, spec):
    """(Readiness, None) when node N (a NodeRun of NODES, FACTS F) can run its job container
    with SPEC; else (None, its problem lines)."""
    if spec is None:
        return None, [
            f"{n.name}: no container_image: set it for every node of the job, or run on the "
            "venvs (--no-container)"
        ]
    user = f[USER]
    ready = readiness.assess(
        f.get(CONTAINER(readiness.engines(spec.engine))),
        spec.engine,
        f[GPUS]["count"],
        user["name"],
    )
    if not ready.ok:
        return None, [f"{n.name}: {p.line()}" for p in ready.problems]
    if ready.sudo:  # sudo's env_reset would drop every `-e NAME` the ranks need
        return None, [
            f"{n.name}: {ready.engine} runs only through sudo here: train needs {user['name']} "
            "to run it directly (rootless podman, or the docker group)"
        ]
    if n.machine != n.name or any(m.machine == n.name and m is not n for m in nodes):
        return None, [
            f"{n.name}: shares its machine with another node of the job: one container of the "
            "job per machine is not supported yet (--limit one node per machine)"
        ]
    return ready, []


def job_containers(nodes, job_id: str, facts: dict, specs: dict, archives: dict):
    """(JobContainers, problems): the container of each NodeRun in NODES from its FACTS (the
    CONTAINER fact, USER, GPUS, RDMA_PORTS), its ContainerSpec (SPECS) and the ArchiveImage its
    archive holds (ARCHIVES); each node that cannot run it is one problem line with the fix."""
    made, problems = {}, []
    for n in nodes:
        spec, f = specs.get(n.name), facts[n.name]
        ready, why = _ready(n, nodes, f, spec)
        problems += why
        if ready is None:
            continue
        held = f.get(CONTAINER(readiness.engines(spec.engine)))["engines"][ready.engine]
        ident = image_id(spec, archives.get(n.name), held)
        if ident is None:
            wanted = archives[n.name].id if n.name in archives else spec.image.qualified
            problems.append(
                f"{n.name}: {ready.engine} does not hold the image {wanted}: run "
                "`invoke provision --roles container`"
            )
            continue
        state = f"{n.home}/.nodeprep"
        made[n.name] = NodeContainer(
            ready.engine,
            ident,
            job_id,
            n.job_dir,
            rootless=readiness.rootless(ready, f[USER]["uid"]),
            gpus=None,  # all of them: CUDA_VISIBLE_DEVICES and --include number the host's
            gpu_count=n.gpus,
            rdma=bool(f.get(RDMA_PORTS)),
            mounts=spec.mounts,
            binds=(state,),
            env_file=f"{state}/runs/{job_id}/{ENV_FILE}",
        )
    engines = {c.engine for c in made.values()}
    if len(engines) > 1:
        problems.append(
            f"the nodes would run different engines ({', '.join(sorted(engines))}): mpirun and "
            "srun exec every rank with the head's; set container_engine for the fleet"
        )
    head = specs.get(nodes[0].name) if nodes else None
    return JobContainers(made, head.env if head is not None else ()), problems
