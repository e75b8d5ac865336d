"""A registry reference read on the controller with skopeo (the containers project's tool for
registries without an engine; Debian's package): what the reference names now, pinned.

`resolve` reads the reference's manifest (one request; a second for a multi-arch list, whose
entry for the node's architecture is taken): the pin is that platform manifest's digest, the
image ID is its `config.digest` (the sha256 of the config, the ID every engine shows after a
pull or a load) and the size is the sum of its compressed layers. A node then pulls
`REPO@DIGEST` (container_fetch: registry), so a tag moved mid-run cannot give two nodes two
images; or `fetch` copies the pinned image once into a docker-archive in nodeprep's state
directory, which travels as any archive does (container_fetch: relay).

skopeo reads the user's own registry settings and logins, as podman does: registries.conf (or
CONTAINERS_REGISTRIES_CONF) for a registry without TLS or a mirror, auth.json or
~/.docker/config.json for credentials. `remember` keeps, in the state directory, the pin each
node was given, so verify-parity and train compare nodes against it without asking the registry.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from nodeprep.errors import NodeprepError

# `uname -m` -> the architecture names of image configs and manifest lists
ARCHES = {
    "x86_64": "amd64",
    "amd64": "amd64",
    "aarch64": "arm64",
    "arm64": "arm64",
    "ppc64le": "ppc64le",
    "s390x": "s390x",
    "riscv64": "riscv64",
}
LISTS = (
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.index.v1+json",
)
INSPECT_TIMEOUT = 120.0
COPY_TIMEOUT = 3600.0
PINS = "pins.json"  # in the state directory's images/: reference -> node -> its Pinned


class RegistryError(NodeprepError):
    """skopeo is missing, or the registry did not answer with an image."""


@dataclass(frozen=True)
class Pinned:
    ref: str  # the reference, its registry named (Image.qualified)
    repo: str  # the reference without its tag and digest
    digest: str  # the platform manifest's digest: a node pulls repo@digest
    id: str  # sha256:<hex> of the config
    arch: str
    size: int  # bytes of the compressed layers

    @property
    def pull(self) -> str:
        return f"{self.repo}@{self.digest}"

    @property
    def tags(self) -> tuple[str, ...]:
        """The name a node gives the image (a reference by digest alone names no tag)."""
        return () if "@" in self.ref else (self.ref,)


def repo_of(ref: str) -> str:
    name = ref.partition("@")[0]
    head, slash, last = name.rpartition("/")
    return f"{head}{slash}{last.partition(':')[0]}"


def arch_of(machine: str | None) -> str:
    return ARCHES.get(machine or "", machine or "amd64")


def digest_of(raw: bytes) -> str:
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def pick(raw: bytes, arch: str, ref: str) -> str | None:
    """The digest of ARCH's entry when RAW is a manifest list (linux only); None when RAW is
    one image's manifest. A list without ARCH is a RegistryError naming the ones it has."""
    doc = _json(raw, ref)
    if doc.get("mediaType") not in LISTS and "manifests" not in doc:
        return None
    have = []
    for m in doc.get("manifests") or []:
        p = m.get("platform") or {}
        if p.get("os", "linux") == "linux":
            if p.get("architecture") == arch:
                if not isinstance(m.get("digest"), str):
                    raise RegistryError(f"{ref}: the index's {arch} entry names no digest")
                return m["digest"]
            have.append(str(p.get("architecture")))
    raise RegistryError(
        f"{ref} has no image for {arch} (it has: {', '.join(have) or 'none for linux'})",
        hint="build and push the image for this architecture, or name one that has it",
    )


def parse_manifest(raw: bytes, ref: str) -> tuple[str, int]:
    """(the image ID: config.digest, the layers' compressed bytes) of one image's manifest."""
    doc = _json(raw, ref)
    config = (doc.get("config") or {}).get("digest")
    if not isinstance(config, str) or not config.startswith("sha256:"):
        raise RegistryError(f"{ref}: the registry's manifest names no config (schema 1?)")
    return config, sum(int(layer.get("size") or 0) for layer in doc.get("layers") or [])


def resolve(ref: str, arch: str, run=None) -> Pinned:
    """REF (qualified) pinned for ARCH: a manifest list's entry for ARCH (two `skopeo inspect
    --raw`), or one image's manifest whose config must be for ARCH (the manifest, then its
    config: a single-architecture image says its architecture only there). A reference with
    both a tag and a digest is read by its digest (skopeo refuses both at once)."""
    run = run or skopeo
    repo = repo_of(ref)
    pinned = ref.partition("@")[2]
    raw = run(
        [
            "skopeo",
            "inspect",
            "--raw",
            f"docker://{repo}@{pinned}" if pinned else f"docker://{ref}",
        ],
        ref,
    )
    inner = pick(raw, arch, ref)
    digest = digest_of(raw)
    if inner is not None:
        raw = run(["skopeo", "inspect", "--raw", f"docker://{repo}@{inner}"], ref)
        digest = inner
    image_id, size = parse_manifest(raw, ref)
    if inner is None:
        config = run(["skopeo", "inspect", "--config", "--raw", f"docker://{repo}@{digest}"], ref)
        have = _json(config, ref).get("architecture")
        if have and have != arch:
            raise RegistryError(
                f"{ref} is an image for {have} only; the node is {arch}",
                hint="build and push it for this architecture too (a manifest list), or name "
                "one that has it",
            )
    return Pinned(ref, repo, digest, image_id, arch, size)


def fetch(pin: Pinned, folder: Path, run=None) -> Path:
    """The pinned image as a docker-archive in FOLDER (named by its ID: one copy per image,
    kept for the next run), tagged with the reference when it names a tag."""
    out = folder / f"{pin.id.split(':')[1]}.docker.tar"
    if out.is_file():
        return out
    folder.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".new")
    tmp.unlink(missing_ok=True)
    dest = f"docker-archive:{tmp}" + (f":{pin.ref}" if pin.tags else "")
    (run or skopeo)(["skopeo", "copy", "-q", f"docker://{pin.pull}", dest], pin.ref, COPY_TIMEOUT)
    os.replace(tmp, out)
    return out


def skopeo(argv: list[str], ref: str, timeout: float = INSPECT_TIMEOUT) -> bytes:
    """ARGV's output (argv[0] is skopeo); a RegistryError with skopeo's last line else.
    CONTAINERS_REGISTRIES_CONF is passed as --registries-conf: skopeo 1.9 (Debian 12) reads the
    variable only through that flag, as podman reads it itself."""
    verb, conf = argv[1], os.environ.get("CONTAINERS_REGISTRIES_CONF")
    if conf:
        argv = [argv[0], "--registries-conf", conf, *argv[1:]]
    try:
        r = subprocess.run(argv, capture_output=True, timeout=timeout)
    except FileNotFoundError:
        raise RegistryError(
            f"{ref}: skopeo is not installed on the controller (nodeprep reads registries with it)",
            hint="install it: apt-get install skopeo (Debian, Ubuntu) or dnf install skopeo",
        ) from None
    except subprocess.TimeoutExpired:
        raise RegistryError(f"{ref}: the registry did not answer in {timeout:.0f} s") from None
    if r.returncode:
        lines = r.stderr.decode(errors="replace").strip().splitlines() or ["(no message)"]
        raise RegistryError(
            f"{ref}: skopeo {verb} failed: {lines[-1][:300]}",
            hint="check the reference; log in with `skopeo login REGISTRY`; a registry without "
            "TLS needs an `insecure = true` entry in registries.conf",
        )
    return r.stdout


def _json(raw: bytes, ref: str) -> dict:
    try:
        doc = json.loads(raw)
    except ValueError:
        raise RegistryError(f"{ref}: the registry's manifest is not JSON") from None
    if not isinstance(doc, dict):
        raise RegistryError(f"{ref}: the registry's manifest is not a JSON object")
    return doc


# -- what each node was given ----------------------------------------------------------------


def remember(state: Path, given: dict[str, Pinned]) -> None:
    """Record the pin each node (of GIVEN) was given, beside the earlier ones."""
    if not given:
        return
    path = state / "images" / PINS
    pins = _pins(path)
    for node, pin in given.items():
        pins.setdefault(pin.ref, {})[node] = asdict(pin)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".new")
    tmp.write_text(json.dumps(pins, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def recall(state: Path, ref: str, node: str) -> Pinned | None:
    got = _pins(state / "images" / PINS).get(ref, {}).get(node)
    try:
        return Pinned(**got) if isinstance(got, dict) else None
    except TypeError:
        return None


def _pins(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}
