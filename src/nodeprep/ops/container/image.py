"""What `container_image` names: an image in a registry, or an archive on the controller.

A registry reference follows the grammar Docker and Podman read (distribution/reference's
reference.go: `[domain[:port]/]path[:tag][@digest]`, path components lowercase alphanumerics
joined by `.`, `_`, `__` or dashes, a tag of at most 128 word characters, dots and dashes, a
digest `algorithm:hex`; the whole name at most 255 characters). An archive is what clusters with
no registry carry: `docker save` / `podman save` output (a tar with manifest.json), an OCI
archive (a tar with index.json) or an OCI layout directory, written as a path (`/`, `./`, `../`,
`~/`) or with the transport podman and skopeo use (`docker-archive:PATH`, `oci-archive:PATH`,
`oci:DIR`). Which archive a bare path is, is read from the file itself (`archive_kind`).
"""

from __future__ import annotations

import re
import tarfile
from dataclasses import dataclass
from pathlib import Path

_ALNUM = r"[a-z0-9]+"
_SEP = r"(?:[._]|__|-+)"
_COMPONENT = rf"{_ALNUM}(?:{_SEP}{_ALNUM})*"
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*|\[[0-9a-fA-F:.]+\])"
_DOMAIN = rf"{_HOST}(?::[0-9]+)?"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_PATH = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
_SHA256 = re.compile(r"sha256:[0-9a-f]{64}")
TRANSPORTS = {"docker-archive": "docker-archive", "oci-archive": "oci-archive", "oci": "oci"}
NAME_MAX = 255


@dataclass(frozen=True)
class Image:
    """`kind`: "registry", or the archive's transport (docker-archive, oci-archive, oci, or
    "archive" for a bare path whose kind is read from the file). `ref` is the registry reference
    as written, `path` the archive's path on the controller as written."""

    kind: str
    ref: str = ""
    path: str = ""
    digest: str = ""  # the @digest a registry reference pins, "" when it names a tag

    @property
    def archive(self) -> bool:
        return self.kind != "registry"

    @property
    def qualified(self) -> str:
        """The registry reference with its registry named, as Docker reads a short one
        (`pytorch:1` is docker.io/library/pytorch:1): Podman would otherwise ask which registry
        to search, or refuse, and two engines could name two images."""
        first, slash, _ = self.ref.partition("/")
        if slash and ("." in first or ":" in first or first == "localhost"):
            return self.ref
        return f"docker.io/{self.ref}" if slash else f"docker.io/library/{self.ref}"


def parse(text: str) -> tuple[Image | None, str]:
    """(the Image, "") or (None, why it is not one, with what to write)."""
    if not isinstance(text, str) or not text.strip():
        return None, "empty: name an image (registry/path:tag) or an archive path"
    if text != text.strip():
        return None, "has spaces around it"
    transport, colon, rest = text.partition(":")
    if colon and transport in TRANSPORTS:
        if not rest:
            return None, f"{transport}: names no path"
        return Image(TRANSPORTS[transport], path=rest), ""
    if text.startswith(("/", "./", "../", "~/")):
        return Image("archive", path=text), ""
    return _registry(text)


def _registry(text: str) -> tuple[Image | None, str]:
    name, at, digest = text.partition("@")
    if at and not re.fullmatch(_DIGEST, digest):
        return None, f"digest {digest!r} is not algorithm:hex (e.g. sha256: and 64 hex digits)"
    if digest.startswith("sha256:") and not _SHA256.fullmatch(digest):
        return None, "a sha256 digest is 64 lowercase hex digits"
    tag = ""
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name, tag = name[: len(name) - len(last) + last.index(":")], last.split(":", 1)[1]
        if not re.fullmatch(_TAG, tag):
            return None, f"tag {tag!r} is not a tag (letters, digits, '_', '.', '-'; at most 128)"
    if len(name) > NAME_MAX:
        return None, f"the name is longer than {NAME_MAX} characters"
    first, slash, path = name.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost" or first != first.lower()):
        if not re.fullmatch(_DOMAIN, first):
            return None, f"registry {first!r} is not a host[:port]"
    else:
        path = name
    if not _PATH.fullmatch(path):
        return None, (
            f"{path!r} is not an image name: lowercase letters and digits, joined by '.', '_', "
            "'__', '-' or '/' (e.g. nvcr.io/nvidia/pytorch:24.05-py3)"
        )
    return Image("registry", ref=text, digest=digest), ""


def archive_kind(path: Path) -> str | None:
    """docker-archive (a tar with manifest.json), oci-archive (a tar with index.json and
    oci-layout), oci (a directory with index.json and oci-layout); None: none of these."""
    if path.is_dir():
        return (
            "oci" if (path / "index.json").is_file() and (path / "oci-layout").is_file() else None
        )
    try:
        with tarfile.open(path) as tar:
            names = {n.lstrip("./") for n in tar.getnames()}
    except (OSError, tarfile.TarError):
        return None
    if "manifest.json" in names:
        return "docker-archive"
    if "index.json" in names and "oci-layout" in names:
        return "oci-archive"
    return None
