"""The engine command lines of a job's container on one node, as data (argv lists): one long-lived
container per node and job, started detached, the ranks' commands run in it with `exec`, removed
with the job. Pure: what the node has (engine, GPUs, RDMA ports) comes in as arguments.

Every flag and why:
  --network host         NCCL, the rendezvous and the launchers see the node's own interfaces
                         and addresses (a bridge network would hide the RDMA and TCP paths)
  --ipc host             the node's /dev/shm: Docker's 64 MB default kills DataLoader workers
                         and NCCL's shared-memory transport
  --userns keep-id       rootless Podman: the job's files are the user's on the host, and the
                         user inside is the user outside (not root mapped to a subordinate id)
  --security-opt label=disable   Podman: no SELinux relabel of the job directory and devices
                         (NVIDIA's CDI guide does the same)
  --device nvidia.com/gpu=I      Podman (CDI): the GPUs this node's ranks use, all or a --limit
                         pick; Docker: --gpus '"device=I,J"' (its nvidia runtime)
  --device /dev/infiniband, --ulimit memlock=-1:-1, --cap-add IPC_LOCK   where the node has
                         RDMA ports: verbs need the devices and pinned memory
  -v DIR:DIR -w JOB      nodeprep's directory on the node (~/.nodeprep: the job directory, the
                         agent, the run directory the ranks report into) at its own path, so the
                         rank contract's paths hold; started in the job directory
  --user UID:GID         Docker, and Podman through sudo: the ranks run as the login user, who
                         owns their files and may stop them (rootless Podman: --userns keep-id)
  --env-file FILE        the job's static variables (NCCL, DeepSpeed's, container_env) from a
                         file nodeprep writes on the node, so no value is on a command line
  -e NAME                each variable passed by name from the calling environment, never
                         with its value on the command line (`ps` shows command lines)
  --label nodeprep.job=ID  how the job's containers are found again for teardown
"""

from __future__ import annotations

import shlex
from dataclasses import KW_ONLY, dataclass

LABEL = "nodeprep.job"
# where the login user's uid:gid goes in start(): shell() writes "$(id -u):$(id -g)" there
USER_IDS = "{uid}:{gid}"


def shell(argv: list[str]) -> str:
    """ARGV as one sh command line (shlex quoting), the user's ids filled in by the node's
    shell."""
    return shlex.join(argv).replace(shlex.quote(USER_IDS), '"$(id -u):$(id -g)"')


@dataclass(frozen=True)
class NodeContainer:
    engine: str  # podman | docker
    image: str  # the image ID (sha256:...)
    job: str  # the job id: letters, digits, '-', '_'
    workdir: str  # the job directory, absolute
    _: KW_ONLY
    sudo: bool = False  # the engine runs through `sudo -n`
    rootless: bool = True  # podman run by a user that is not root
    gpus: tuple[int, ...] | None = None  # None: all of the node's GPUs; (): none
    gpu_count: int = 0  # GPUs the node has
    rdma: bool = False  # the node has RDMA ports
    mounts: tuple = ()  # spec.Mount
    env: tuple[str, ...] = ()  # variable names to pass in
    binds: tuple[str, ...] = ()  # directories bound at their own path (default: the workdir)
    env_file: str | None = None  # --env-file on the node

    @property
    def name(self) -> str:
        return f"nodeprep-{self.job}"

    def _engine(self) -> list[str]:
        return (["sudo", "-n"] if self.sudo else []) + [self.engine]

    def _gpu_flags(self) -> list[str]:
        if not self.gpu_count or self.gpus == ():
            return []
        picked = list(range(self.gpu_count)) if self.gpus is None else list(self.gpus)
        if self.engine == "docker":
            which = "all" if self.gpus is None else '"device=' + ",".join(map(str, picked)) + '"'
            return ["--gpus", which]
        if self.gpus is None:
            return ["--device", "nvidia.com/gpu=all"]
        return [w for i in picked for w in ("--device", f"nvidia.com/gpu={i}")]

    def start(self) -> list[str]:
        """argv that starts the job's container on the node, detached, doing nothing until the
        ranks are exec'd into it."""
        argv = self._engine() + [
            "run",
            "-d",
            "--rm",
            "--name",
            self.name,
            "--label",
            f"{LABEL}={self.job}",
            "--network",
            "host",
            "--ipc",
            "host",
        ]
        if self.engine == "podman":
            argv += ["--security-opt", "label=disable"]
            if self.rootless:
                argv += ["--userns", "keep-id"]
        argv += self._gpu_flags()
        if self.rdma:
            argv += ["--device", "/dev/infiniband", "--ulimit", "memlock=-1:-1"]
            argv += ["--cap-add", "IPC_LOCK"]
        if self.engine == "docker" or not self.rootless:
            argv += ["--user", USER_IDS]
        for path in self.binds or (self.workdir,):
            argv += ["-v", f"{path}:{path}"]
        argv += ["-w", self.workdir]
        if self.env_file:
            argv += ["--env-file", self.env_file]
        for m in self.mounts:
            argv += ["-v", f"{m.source}:{m.target}" + (":ro" if m.read_only else "")]
        for name in self.env:
            argv += ["-e", name]
        # the image's own ENTRYPOINT would run instead (a `python` one exits at once)
        return argv + ["--entrypoint", "sleep", self.image, "infinity"]

    def exec(self, command: list[str], env: tuple[str, ...] = ()) -> list[str]:
        """argv that runs COMMAND in the job's container, with ENV (names) passed in."""
        argv = self._engine() + ["exec", "-i", "-w", self.workdir]
        for name in env:
            argv += ["-e", name]
        return argv + [self.name] + list(command)

    def remove(self) -> list[str]:
        """argv that removes the job's container at once, whatever it runs."""
        if self.engine == "podman":
            return self._engine() + ["rm", "-f", "-t", "0", "--ignore", self.name]
        return self._engine() + ["rm", "-f", self.name]

    def leftovers(self) -> list[str]:
        """argv listing the job's containers still on the node (by label): empty output when
        none is left."""
        return self._engine() + [
            "ps",
            "-a",
            "-q",
            "--filter",
            f"label={LABEL}={self.job}",
        ]
