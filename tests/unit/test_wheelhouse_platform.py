"""The wheelhouse resolved on this (x86_64) controller for another machine's platform: pip
evaluates environment markers for the machine it runs on, even with --platform, so a
resolution for aarch64 nodes would take x86-only dependencies and drop aarch64-only ones.
Resolved through Wheelhouse.resolve with real pip against a local index of made wheels: a
package requiring one dependency on x86_64 and another on aarch64 (the shape of torch's
`nvidia-*; platform_machine == "x86_64"`), and a pin that itself carries a marker."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from nodeprep.ops.pystack.wheelhouse import Platform, Wheelhouse


def wheel(where: Path, name: str, requires: tuple[str, ...] = ()) -> None:
    dist = f"{name}-1.0.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    with zipfile.ZipFile(where / f"{name}-1.0-py3-none-any.whl", "w") as z:
        z.writestr(f"{name}/__init__.py", "")
        z.writestr(f"{dist}/METADATA", meta)
        z.writestr(
            f"{dist}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: nodeprep-test\n"
            "Root-Is-Purelib: true\nTag: py3-none-any\n",
        )
        z.writestr(f"{dist}/RECORD", "")


@pytest.fixture
def index(tmp_path):
    d = tmp_path / "index"
    d.mkdir()
    wheel(
        d,
        "npapp",
        (
            'npx86only==1.0; platform_machine == "x86_64"',
            'nparmonly==1.0; platform_machine == "aarch64"',
            "npany==1.0",
            'nplegacy==1.0; python_version < "3.8"',
        ),
    )
    for n in ("npx86only", "nparmonly", "npany", "nplegacy", "npgh200tool"):
        wheel(d, n)
    return d


def resolved(tmp_path, index, platform: Platform) -> list[str]:
    wh = Wheelhouse(tmp_path / f"wh-{platform.arch}")
    pins = ["npapp==1.0", 'npgh200tool==1.0; platform_machine == "aarch64"']
    return wh.resolve(platform, pins, ["--no-index"], [index])["lock"]


@pytest.mark.slow(reason="runs pip twice (about 4 s)")
def test_a_foreign_platform_gets_its_own_dependencies(tmp_path, index):
    arm = resolved(tmp_path, index, Platform("aarch64", "3.11", "2.36"))
    x86 = resolved(tmp_path, index, Platform("x86_64", "3.11", "2.36"))
    assert arm == ["npany==1.0", "npapp==1.0", "nparmonly==1.0", "npgh200tool==1.0"], arm
    assert x86 == ["npany==1.0", "npapp==1.0", "npx86only==1.0"], x86


def test_the_marker_environment_is_the_nodes():
    env = Platform("aarch64", "3.12", "2.39").markers()
    assert (
        env["platform_machine"] == "aarch64"
        and env["python_version"] == "3.12"
        and env["sys_platform"] == "linux"
    )
