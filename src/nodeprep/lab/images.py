"""The lab's test images, made here (no image can be downloaded on these machines): a Debian 12
root with Python built by mmdebstrap from Debian's packages, ONCE, cached under
/var/cache/nodeprep/images/ (keyed by the package list and the recipe, built into `.new` and
renamed), then written as a `docker save` archive (docker-archive: manifest.json, the config,
one layer) by `docker_archive`, which needs no engine on the controller. Podman and Docker load
it as they load any saved image.

`train_root` is the training image: the same root plus /opt/venv holding the lab's training
stack (TRAIN_PINS: CPU torch, DeepSpeed, numpy), installed offline inside the root from wheels
the caller resolved on the controller (as the wheelhouse role does); its archive puts
/opt/venv/bin first on the PATH, as NVIDIA's images put their Python there.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
from pathlib import Path

from nodeprep.errors import NodeprepError

CACHE = Path("/var/cache/nodeprep/images")
PACKAGES = ("python3", "python3-venv", "procps")
RECIPE = 1  # bump when the build below changes
BUILD_TIMEOUT = 900
# the training image's stack: the lab's own pins (inventory/lab, requirements/node.txt)
TRAIN_PINS = ("torch==2.13.0+cpu", "numpy==2.4.6", "deepspeed==0.19.8")
TRAIN_BUILDS = {"deepspeed==0.19.8": {"DS_BUILD_OPS": "0"}}  # an sdist: built here, once
TRAIN_PATH = {"PATH": "/opt/venv/bin:/usr/local/bin:/usr/bin:/bin"}


def _key(extra=()) -> str:
    text = json.dumps({"packages": PACKAGES, "recipe": RECIPE, "suite": "bookworm"})
    text += json.dumps(list(extra)) if extra else ""
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def base_root(log=print) -> Path:
    """The cached root file system tar (built the first time: about a minute)."""
    return _root(CACHE / f"bookworm-{_key()}.rootfs.tar", [], log)


def train_root(wheels: Path, log=print) -> Path:
    """The cached training root: base_root's packages plus /opt/venv with TRAIN_PINS installed
    offline from WHEELS, a directory of wheels for Debian 12's CPython 3.11 on x86_64 (the
    caller resolves them: tests/integration/test_containers_train.py); built the first time,
    in about two minutes."""
    path = CACHE / f"bookworm-train-{_key(TRAIN_PINS)}.rootfs.tar"
    if path.is_file():
        return path
    hooks = [
        f'mkdir -p "$1/tmp/wheels" && cp {wheels}/*.whl "$1/tmp/wheels/"',
        'chroot "$1" python3 -m venv /opt/venv',
        # the venv's python3 first on chroot's PATH: pip installs into the venv
        'PATH=/opt/venv/bin:/usr/sbin:/usr/bin:/sbin:/bin chroot "$1" python3 -m pip install -q '
        "--no-index --find-links /tmp/wheels " + " ".join(TRAIN_PINS),
        'rm -rf "$1/tmp/wheels" "$1/root/.cache"',
    ]
    return _root(path, [w for h in hooks for w in ("--customize-hook", h)], log)


def _root(path: Path, extra: list[str], log) -> Path:
    if path.is_file():
        return path
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".new")
    tmp.unlink(missing_ok=True)
    log(f"building the lab's test image root {path.name} with mmdebstrap (once)")
    try:
        r = subprocess.run(
            [
                "mmdebstrap",
                "--variant=apt",
                "--include=" + ",".join(PACKAGES),
                "--format=tar",
                *extra,
                "bookworm",
                str(tmp),
            ],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        raise NodeprepError(f"mmdebstrap took over {BUILD_TIMEOUT} s") from None
    if r.returncode:
        tmp.unlink(missing_ok=True)
        raise NodeprepError(f"mmdebstrap failed: {(r.stderr or r.stdout).strip()[-400:]}")
    os.replace(tmp, path)
    return path


def docker_archive(root: Path, out: Path, tag: str, env: dict[str, str] | None = None) -> Path:
    """OUT: a docker-archive of one layer (ROOT, a root file system tar) tagged TAG; an OUT
    newer than ROOT is kept (the same bytes would be written again)."""
    if out.is_file() and out.stat().st_mtime_ns >= root.stat().st_mtime_ns:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    layer_id = _sha256_file(root)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Env": [
                f"{k}={v}" for k, v in (env or {"PATH": "/usr/local/bin:/usr/bin:/bin"}).items()
            ],
            "Cmd": ["/bin/sh"],
        },
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_id}"]},
        "history": [{"created_by": f"nodeprep lab: {root.name}"}],
    }
    blob = json.dumps(config, sort_keys=True).encode()
    config_name = hashlib.sha256(blob).hexdigest() + ".json"
    manifest = [{"Config": config_name, "RepoTags": [tag], "Layers": [f"{layer_id}/layer.tar"]}]
    tmp = out.with_suffix(".new")
    with tarfile.open(tmp, "w") as tar:
        _add(tar, config_name, blob)
        _add(tar, "manifest.json", json.dumps(manifest).encode())
        tar.add(root, arcname=f"{layer_id}/layer.tar")
    os.replace(tmp, out)
    return out


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def _sha256_file(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
