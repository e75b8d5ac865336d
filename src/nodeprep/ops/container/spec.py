"""A node's container settings as one object, checked: the image, the engine, how the image
is fetched, the extra mounts and variables (roles/container/defaults.yml documents each).
`from_vars` returns the spec or the variable and the reason it is refused, for the role's
one-line file:line error."""

from __future__ import annotations

import re
from dataclasses import dataclass

from nodeprep.ops.container import image as imagemod
from nodeprep.redact import is_secret

ENGINES = ("auto", "podman", "docker")
FETCHES = ("relay", "registry")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# characters a mount path may not hold: the engines split -v on ':' and --mount on ','
_PATH_BAD = re.compile(r"[:,\s]")


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    read_only: bool = False


@dataclass(frozen=True)
class ContainerSpec:
    image: imagemod.Image
    engine: str = "auto"
    fetch: str = "relay"
    mounts: tuple[Mount, ...] = ()
    env: tuple[tuple[str, str], ...] = ()


class Refused(Exception):
    """VAR's value cannot be used: str(self) says why and what to write."""

    def __init__(self, var: str, why: str):
        super().__init__(why)
        self.var = var


def from_vars(v: dict) -> ContainerSpec | None:
    """The spec of a node's variables; None when container_image is unset (the venv way).
    Raises Refused."""
    if v.get("container_image") in (None, ""):
        return None
    image, why = imagemod.parse(v["container_image"])
    if image is None:
        raise Refused("container_image", why)
    engine = v.get("container_engine") or "auto"
    if engine not in ENGINES:
        raise Refused("container_engine", f"{engine!r} is not one of {', '.join(ENGINES)}")
    fetch = v.get("container_fetch") or "relay"
    if fetch not in FETCHES:
        raise Refused("container_fetch", f"{fetch!r} is not one of {', '.join(FETCHES)}")
    if fetch == "registry" and image.archive:
        raise Refused(
            "container_fetch",
            "registry: an archive has no registry to pull from (use relay, or name the image "
            "by its registry reference)",
        )
    return ContainerSpec(
        image,
        engine,
        fetch,
        tuple(_mount(m) for m in v.get("container_mounts") or ()),
        tuple(_env(k, val) for k, val in (v.get("container_env") or {}).items()),
    )


def _mount(text) -> Mount:
    if not isinstance(text, str):
        raise Refused("container_mounts", "each mount is a string HOST_PATH:CONTAINER_PATH[:ro]")
    parts = text.split(":")
    ro = len(parts) == 3 and parts[2] in ("ro", "rw")
    if len(parts) not in (2, 3) or (len(parts) == 3 and not ro):
        raise Refused(
            "container_mounts",
            f"{text!r} is not HOST_PATH:CONTAINER_PATH[:ro] (a path may not hold ':')",
        )
    for path in parts[:2]:
        if not path.startswith("/"):
            raise Refused("container_mounts", f"{text!r}: {path!r} is not an absolute path")
        if _PATH_BAD.search(path):
            raise Refused(
                "container_mounts",
                f"{text!r}: {path!r} holds a space, ',' or ':' the engines split on",
            )
    return Mount(parts[0], parts[1], len(parts) == 3 and parts[2] == "ro")


def _env(name, value) -> tuple[str, str]:
    if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
        raise Refused("container_env", f"{name!r} is not a variable name (letters, digits, '_')")
    if is_secret(name):
        # container_env's values are part of the container's start command (shown by
        # --dry-run, kept in the run's job.json); a secret goes by the node's own file
        raise Refused(
            "container_env",
            f"{name} names a secret: put it in deepspeed_env (nodeprep writes it to each "
            "node's ~/.deepspeed_env, and the job's container reads it from there unshown)",
        )
    if isinstance(value, (dict, list)) or value is None or "\n" in str(value):
        raise Refused("container_env", f"{name}: the value must be a single-line scalar")
    if isinstance(value, bool):
        value = "1" if value else "0"
    return name, str(value)
