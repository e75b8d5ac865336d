"""Whether a node can run the image, from its CONTAINER fact: the engine nodeprep uses there,
how (directly or through `sudo -n`), and each missing piece as a one-line problem with its fix.

`assess(fact, wanted, gpus, user)` is a pure function of the facts; the container role fails
its engine step with the first problem, and doctor-style reports list them all.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PREFERENCE = ("podman", "docker")  # auto: the first the node has and may run


@dataclass(frozen=True)
class Problem:
    code: str
    what: str
    fix: str

    def line(self) -> str:
        return f"{self.what}: {self.fix}"


@dataclass
class Readiness:
    engine: str = ""  # podman | docker | "" (none usable)
    sudo: bool = False  # the engine runs only through `sudo -n`
    version: str = ""
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.engine) and not self.problems

    def command(self) -> list[str]:
        """The engine's argv prefix on this node."""
        return (["sudo", "-n"] if self.sudo else []) + [self.engine]


def engines(wanted: str | None) -> str:
    """The CONTAINER fact's argument for a container_engine value: the engines to look at."""
    return ",".join(PREFERENCE) if (wanted or "auto") == "auto" else wanted


def rootless(ready: Readiness, uid: int) -> bool:
    """Podman run by its user directly, not root: its containers map the user's ids (keep-id),
    and Podman keeps an id-shifted copy of each image's layers for that mapping."""
    return ready.engine == "podman" and not ready.sudo and uid != 0


def _missing(wanted: str) -> Problem:
    if wanted == "auto":
        return Problem(
            "CONTAINER_NO_ENGINE",
            "no container engine (podman or docker) on the PATH",
            "install one (Debian/Ubuntu: apt-get install podman), or set container_engine to "
            "the one the node has",
        )
    return Problem(
        "CONTAINER_NO_ENGINE",
        f"{wanted} is not on the PATH",
        f"install {wanted} (Debian/Ubuntu: apt-get install "
        f"{'podman' if wanted == 'podman' else 'docker.io'}), or set container_engine: auto",
    )


def _refused(name: str, e: dict, user: str) -> Problem:
    words = e.get("info") or ""
    low = words.lower()
    if e.get("access") == "timeout":
        return Problem(
            "CONTAINER_ENGINE_HUNG",
            f"`{name} info` did not answer within its timeout",
            f"the {name} daemon or its storage is stuck: restart it (systemctl restart {name})",
        )
    if name == "docker" and "permission denied" in low:
        return Problem(
            "CONTAINER_NOT_ALLOWED",
            f"{user} may not use the docker daemon's socket",
            f"add the user to the docker group (sudo usermod -aG docker {user}), then log in "
            "again, or allow `sudo -n docker`",
        )
    if name == "docker" and ("cannot connect" in low or "is the docker daemon running" in low):
        return Problem(
            "CONTAINER_DAEMON_DOWN",
            "the docker daemon does not answer",
            "start it (sudo systemctl enable --now docker)",
        )
    if name == "podman" and ("newuidmap" in low or "user namespace" in low):
        return Problem(
            "CONTAINER_NOT_ALLOWED",
            f"rootless podman cannot make a user namespace for {user}",
            "install uidmap (newuidmap) and allow user namespaces (sysctl "
            "user.max_user_namespaces > 0)",
        )
    first = words.split(". ")[0][:200] or "it failed without a message"
    return Problem(
        "CONTAINER_NOT_ALLOWED",
        f"`{name} info` fails for {user}: {first}",
        f"make `{name} info` work for {user} on the node (or allow `sudo -n {name}`)",
    )


def assess(fact: dict | None, wanted: str, gpus: int, user: str) -> Readiness:
    """WANTED: auto, podman or docker; GPUS: how many GPUs the node has (the toolkit is
    needed only then)."""
    if not fact:
        return Readiness(
            problems=[
                Problem(
                    "CONTAINER_UNKNOWN",
                    "the node did not say which container engines it has",
                    "run `invoke facts` on it and see the run log",
                )
            ]
        )
    engines = fact.get("engines") or {}
    names = PREFERENCE if wanted == "auto" else (wanted,)
    present = [n for n in names if n in engines]
    if not present:
        return Readiness(problems=[_missing(wanted)])
    usable = [n for n in present if engines[n].get("access") in ("ok", "sudo")]
    if not usable:
        name = present[0]
        return Readiness(name, problems=[_refused(name, engines[name], user)])
    name = min(usable, key=lambda n: engines[n]["access"] != "ok")  # direct beats sudo
    e = engines[name]
    ready = Readiness(name, sudo=e["access"] == "sudo", version=e.get("version") or "")
    if name == "podman" and e["access"] == "ok" and e.get("subids") == "no":
        ready.problems.append(
            Problem(
                "CONTAINER_NO_SUBIDS",
                f"rootless podman has no subordinate ids for {user}: an image with files of "
                "other owners cannot load ('insufficient UIDs or GIDs available in user "
                "namespace')",
                f"sudo usermod --add-subuids 100000-165535 --add-subgids 100000-165535 {user}, "
                "then `podman system migrate` as the user",
            )
        )
    if gpus and not _toolkit(fact, name, e):
        ready.problems.append(
            Problem(
                "CONTAINER_NO_GPU_TOOLKIT",
                f"the node has {gpus} GPU(s) but {name} cannot pass them in: no CDI spec for "
                "nvidia.com/gpu" + (" and no nvidia runtime" if name == "docker" else ""),
                "install nvidia-container-toolkit and run `sudo nvidia-ctk cdi generate "
                "--output=/etc/cdi/nvidia.yaml`"
                + (
                    " (docker: `sudo nvidia-ctk runtime configure --runtime=docker`, restart it)"
                    if name == "docker"
                    else ""
                ),
            )
        )
    return ready


def _toolkit(fact: dict, name: str, e: dict) -> bool:
    """Podman passes GPUs by CDI (`--device nvidia.com/gpu=all`); docker by its nvidia runtime
    (`--gpus`) or, from 25.0, by CDI too."""
    if fact.get("cdi"):
        return True
    return name == "docker" and "nvidia" in (e.get("runtimes") or [])


def storage_short(fact: dict | None, engine: str, need: int) -> str | None:
    """Why ENGINE's image storage cannot take NEED more bytes (its free space as the fact saw
    it), with the fix; None when it can or the fact did not say (the load then tells)."""
    e = ((fact or {}).get("engines") or {}).get(engine) or {}
    free = e.get("free_bytes")
    if free is None or free >= need:
        return None
    return (
        f"{engine}'s image storage {e.get('root') or '?'} has {free / 1e9:.1f} GB free, the "
        f"image needs about {need / 1e9:.1f} GB: free space there (`{engine} system prune`, or "
        "remove old images) or move the storage to a larger disk"
    )
