"""An image archive read on the controller, without an engine: its image ID, architecture and
names, from the files the formats define.

The image ID Docker and Podman both show is the sha256 of the image's config blob, so it is
computed here from the config's bytes (never taken from a file name): a docker-archive's
manifest.json names the config (`Config`) and the tags (`RepoTags`); an OCI layout's index.json
names a manifest blob, whose `config.digest` is the config (the tag is the
`org.opencontainers.image.ref.name` annotation). Loading the archive on a node gives the same ID,
which is how every node is checked to hold the same image.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path

from nodeprep.errors import InputError
from nodeprep.ops.container.image import archive_kind

REF_NAME = "org.opencontainers.image.ref.name"


@dataclass(frozen=True)
class ArchiveImage:
    path: Path
    kind: str  # docker-archive | oci-archive | oci
    id: str  # sha256:<hex> of the config
    arch: str  # the config's architecture (amd64, arm64, ...)
    tags: tuple[str, ...]
    size: int  # bytes of the archive (a directory: of its files)


class NotAnImage(Exception):
    """The file is no image archive nodeprep can read: str(self) says why."""


def locate(text: str, origin_file: str | None) -> Path:
    """The archive path as written in container_image: ~ expanded, a relative path beside the
    inventory file that set it (as python_requirements), else from the working directory."""
    path = Path(text).expanduser()
    if not path.is_absolute():
        path = (Path(origin_file).parent if origin_file else Path.cwd()) / path
    return path


def named(image, file: str | None, line: int | None, cache: dict) -> ArchiveImage:
    """The archive container_image names (IMAGE: its parsed value, set at FILE:LINE), read
    once per path into CACHE; one that is no image archive is one file:line input error."""
    path = locate(image.path, file)
    if path not in cache:
        try:
            cache[path] = read(path, image.kind)
        except NotAnImage as e:
            raise InputError(f"container_image {str(path)!r}: {e}", file=file, line=line) from None
    return cache[path]


def read(path: Path, kind: str | None = None) -> ArchiveImage:
    kind = kind if kind in ("docker-archive", "oci-archive", "oci") else archive_kind(path)
    if kind is None:
        raise NotAnImage(
            "not an image archive: a `docker save` / `podman save` tar (manifest.json), an OCI "
            "archive or an OCI layout directory (index.json and oci-layout)"
        )
    try:
        if kind == "oci":
            files = _DirFiles(path)
            size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        else:
            files = _TarFiles(path)
            size = path.stat().st_size
        with files:
            if kind == "docker-archive":
                config, tags = _docker(files)
            else:
                config, tags = _oci(files)
    except (OSError, tarfile.TarError, KeyError, ValueError, IndexError, TypeError) as e:
        raise NotAnImage(f"cannot read it as {kind}: {e}") from None
    arch = json.loads(config).get("architecture", "")
    ident = "sha256:" + hashlib.sha256(config).hexdigest()
    return ArchiveImage(path, kind, ident, arch, tuple(tags), size)


def _docker(files) -> tuple[bytes, list[str]]:
    manifest = json.loads(files.read("manifest.json"))
    if len(manifest) != 1:
        raise ValueError(f"it holds {len(manifest)} images; nodeprep sends one (save one image)")
    entry = manifest[0]
    return files.read(entry["Config"]), list(entry.get("RepoTags") or [])


def _oci(files) -> tuple[bytes, list[str]]:
    index = json.loads(files.read("index.json"))
    manifests = index["manifests"]
    if len(manifests) != 1:
        raise ValueError(f"its index names {len(manifests)} manifests; nodeprep sends one")
    desc = manifests[0]
    manifest = json.loads(files.read(_blob(desc["digest"])))
    if "manifests" in manifest:
        raise ValueError("it is a multi-platform index; save the platform of the nodes only")
    tag = (desc.get("annotations") or {}).get(REF_NAME)
    return files.read(_blob(manifest["config"]["digest"])), [tag] if tag else []


def _blob(digest: str) -> str:
    algo, _, hexd = digest.partition(":")
    return f"blobs/{algo}/{hexd}"


class _TarFiles:
    def __init__(self, path: Path):
        self.tar = tarfile.open(path)
        self.names = {m.name.lstrip("./"): m for m in self.tar.getmembers()}

    def read(self, name: str) -> bytes:
        member = self.names[name.lstrip("./")]
        handle = self.tar.extractfile(member)
        if handle is None:
            raise KeyError(name)
        return handle.read()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.tar.close()


class _DirFiles:
    def __init__(self, path: Path):
        self.path = path

    def read(self, name: str) -> bytes:
        target = (self.path / name).resolve()
        if self.path.resolve() not in target.parents:
            raise KeyError(name)
        return target.read_bytes()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass
