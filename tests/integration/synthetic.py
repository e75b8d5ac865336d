"""Small synthetic Python stacks for lab tests that are about moving and installing wheels,
not about resolving a real one (torch, DeepSpeed): pure-Python wheels of random bytes with
valid metadata, served to the controller's `pip download` from a local directory."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path


def make_wheel(where: Path, name: str, size: int) -> Path:
    """A pure-Python wheel pip accepts, SIZE bytes of random data inside (stored, not deflated)."""
    dist = f"{name}-1.0.dist-info"
    path = where / f"{name}-1.0-py3-none-any.whl"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"
    wheel = (
        "Wheel-Version: 1.0\nGenerator: nodeprep-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr(f"{name}/data.bin", os.urandom(size))
        z.writestr(f"{dist}/METADATA", meta)
        z.writestr(f"{dist}/WHEEL", wheel)
        z.writestr(f"{dist}/RECORD", "")
    return path


def make_stack(where: Path, prefix: str, sizes: list[int]) -> Path:
    """Wheels PREFIX0.. of SIZES bytes in WHERE/wheels and WHERE/req.txt pinning them; returns
    the requirements file. Serve them with PIP_NO_INDEX=1, PIP_FIND_LINKS=WHERE/wheels."""
    wheels = where / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    for i, size in enumerate(sizes):
        make_wheel(wheels, f"{prefix}{i}", size)
    req = where / "req.txt"
    req.write_text("".join(f"{prefix}{i}==1.0\n" for i in range(len(sizes))))
    return req


def stack_sets(req: Path, venv: str, wheelhouse: str, env_file: str) -> tuple[str, ...]:
    """--set overrides that provision REQ (and no torch, no wheel builds) into a venv and a
    wheelhouse of their own, the venv's PATH block in an env file of its own (one no shell
    reads): the site's stack and environment on the same nodes are left as they are."""
    return (
        f"python_requirements=[{req}]",
        "wheel_builds={}",
        "torch_version=",
        f"venv_path={venv}",
        f"wheelhouse_dir={wheelhouse}",
        f"env_file={env_file}",
    )
