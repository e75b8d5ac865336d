"""Wheelhouse inputs, platform tags, venv bootstrap scripts and the on-node torch check, without
a node. The torch check runs against a stand-in `torch` module so CUDA builds can be exercised
on this CPU-only machine (the real CPU build is verified on the lab in integration tests)."""

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from nodeprep.errors import InputError
from nodeprep.ops.provision import roles
from nodeprep.ops.pystack.wheelhouse import Platform, read_requirements
from nodeprep.settings import find_project

ROLES = find_project() / "roles"


def test_requirements_must_be_pinned(tmp_path):
    ok = tmp_path / "ok.txt"
    ok.write_text("# comment\nnumpy==2.4.6  # trailing\n\ntorch==2.13.0+cpu\n")
    assert read_requirements([ok]) == ["numpy==2.4.6", "torch==2.13.0+cpu"]
    for line, msg in [
        ("torch", "torch is not pinned"),
        ("numpy>=2", "numpy is not pinned"),
        ("numpy==2,<3", "numpy is not pinned"),
        ("!!", "not a requirement"),
    ]:
        bad = tmp_path / "bad.txt"
        bad.write_text(f"pip==26.3\n{line}\n")
        with pytest.raises(InputError) as e:
            read_requirements([bad])
        assert str(e.value).startswith(f"{bad}:2: {msg}")
    with pytest.raises(InputError, match="requirements file not found"):
        read_requirements([tmp_path / "missing.txt"])


def test_platform_tags_follow_glibc():
    p = Platform("x86_64", "3.11", "2.28")
    args = p.pip_args()
    tags = [args[i + 1] for i, a in enumerate(args) if a == "--platform"]
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_5_x86_64" in tags
    assert "manylinux2014_x86_64" in tags and "manylinux_2_29_x86_64" not in tags
    old = Platform("aarch64", "3.8", "2.12").pip_args()
    assert "manylinux2014_aarch64" not in old and "manylinux2010_aarch64" in old
    assert p.key == "cp311-x86_64-glibc2.28"


def _venv_role():
    return roles.load("venv", ROLES)[0].module


@pytest.mark.parametrize(
    "mode,has_nopip,has_ensure",
    [("no-pip", True, False), ("ensurepip", False, True), ("auto", True, True)],
)
def test_venv_create_script(mode, has_nopip, has_ensure):
    s = _venv_role().create_script(
        "/opt/py 3/bin/python3", "~/.nodeprep/venv", "~/.nodeprep/wheelhouse", mode
    )
    assert ("--without-pip" in s) == has_nopip and ("'bootstrap: ensurepip'" in s) == has_ensure
    assert "'/opt/py 3/bin/python3'" in s and '"$HOME"/' in s


@pytest.mark.slow(reason="downloads pip's wheel (pip download), makes a venv and installs it")
def test_venv_no_pip_bootstrap_really_works_offline(tmp_path):
    """The no-pip script on this machine: venv --without-pip, then pip installs itself from a
    wheel with --no-index (the wheel comes from pip's local cache of the registry here)."""
    wh = tmp_path / "wh"
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wh), "pip==26.3"],
        check=True,
        capture_output=True,
    )
    script = _venv_role().create_script("python3", str(tmp_path / "v"), str(wh), "no-pip")
    r = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "bootstrap: offline pip wheel" in r.stdout
    out = subprocess.run(
        [str(tmp_path / "v/bin/python"), "-m", "pip", "--version"], capture_output=True, text=True
    ).stdout
    assert out.startswith("pip 26.3")


FAKE_TORCH = """
__version__ = {version!r}
class version: cuda = {cuda!r}
class cuda:
    @staticmethod
    def get_arch_list(): return {arch!r}
"""


@pytest.mark.parametrize(
    "installed,want,ok",
    [
        (("2.13.0+cpu", None, []), ("2.13.0+cpu", None, []), True),
        (
            (
                "2.13.0+cu130",
                "13.0",
                ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"],
            ),
            ("2.13.0+cu130", "13.0", ["8.9", "9.0"]),
            True,
        ),  # 8.9 runs sm_86 code
        (
            (
                "2.6.0+cu126",
                "12.6",
                ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"],
            ),
            ("2.6.0+cu126", "12.6", ["10.0"]),
            False,
        ),  # never across majors
        (
            ("2.13.0+cu130", "13.0", ["sm_90", "compute_90"]),
            ("2.13.0+cu130", "13.0", ["10.0"]),
            True,
        ),
        (("2.13.0+cpu", None, []), ("2.13.0+cu130", "13.0", []), False),  # wrong build installed
    ],
)
def test_torch_verify_script(tmp_path, installed, want, ok):
    (tmp_path / "torch").mkdir()
    v, c, a = installed
    (tmp_path / "torch" / "__init__.py").write_text(FAKE_TORCH.format(version=v, cuda=c, arch=a))
    verify = roles.load("torch", ROLES)[0].module.VERIFY
    listing = tmp_path / "listing"
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            verify,
            json.dumps({"version": want[0], "cuda": want[1], "capabilities": want[2]}),
            str(listing),
        ],
        env={"PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
    )
    assert (r.returncode == 0) == ok, r.stderr
    assert json.loads(r.stdout.splitlines()[0])["version"] == v
    # what the stamp will record: only after a verify that passed; line 1 says what was
    # verified and on which CPU, then the files whose change could break the import
    assert listing.exists() == ok
    if ok:
        head, *names = listing.read_text().splitlines()
        assert json.loads(head) == {
            "version": v,
            "cuda": c,
            "arch_list": a,
            "machine": platform.machine(),
        }
        assert [n for n in names if n.endswith("torch/__init__.py")], names


@pytest.mark.parametrize(
    "tag,arch",
    [
        ("manylinux_2_17_x86_64", "x86_64"),
        ("manylinux2014_aarch64", "aarch64"),
        ("manylinux1_x86_64", "x86_64"),
        ("manylinux2010_i686", "i686"),
        ("musllinux_1_2_aarch64", "aarch64"),
        ("linux_ppc64le", "ppc64le"),
        ("manylinux_2_28_s390x", "s390x"),
        ("linux_armv7l", "armv7l"),
        ("win_amd64", "win_amd64"),
        ("macosx_11_0_arm64", "macosx_11_0_arm64"),
    ],
)
def test_a_platform_tag_names_its_cpu(tag, arch):
    from nodeprep.ops.pystack.tags import tag_arch

    assert tag_arch(tag) == arch


def test_a_venv_of_x86_64_wheels_is_foreign_on_aarch64_only():
    """The recorded x86_64 venv (tests/facts/venv/x86_64_wheels_tagged.json) through the VENV
    parser: its compiled packages are named on an aarch64 node, nothing on x86_64; pure-Python
    packages never are."""
    from nodeprep.engine.facts import VENV
    from nodeprep.ops.pystack import foreign_packages
    from nodeprep.ops.pystack.tags import describe

    case = json.loads(
        (Path(__file__).parents[1] / "facts" / "venv" / "x86_64_wheels_tagged.json").read_text()
    )
    venv = VENV.parse(case["output"], case["rc"])
    assert foreign_packages(venv, "x86_64") == {}
    foreign = foreign_packages(venv, "aarch64")
    assert foreign == {"markupsafe": ["x86_64"], "numpy": ["x86_64"], "torch": ["x86_64"]}
    assert describe(foreign, limit=2) == ("numpy, torch and 1 more", "x86_64")
    assert foreign_packages(None, "aarch64") == {} and foreign_packages(venv, None) == {}
    # a wheel tagged for both CPUs (a universal build) suits either
    both = dict(venv, platforms={"numpy": ["manylinux_2_28_x86_64", "manylinux_2_28_aarch64"]})
    assert foreign_packages(both, "aarch64") == {}


def test_the_packages_a_stamp_names_as_changed():
    """Paths the torch verify stamps, relative to the venv, mapped to the lock's pins: a
    package's own directory, its bundled .libs, its dist-info RECORD, a top-level module."""
    from nodeprep.ops.pystack import damaged

    lock = ["numpy==2.4.6", "torch==2.13.0+cpu", "typing-extensions==4.15.0", "pyyaml==6.0.3"]
    sp = "lib/python3.11/site-packages/"
    stamp = {
        "changed": [
            sp + "numpy/_core/_multiarray_umath.cpython-311-x86_64-linux-gnu.so",
            sp + "torch.libs/libgomp-a34b3233.so.1",
            sp + "typing_extensions.py",
            sp + "typing_extensions-4.15.0.dist-info/RECORD",
        ]
    }
    assert damaged(stamp, lock) == [
        "numpy==2.4.6",
        "torch==2.13.0+cpu",
        "typing-extensions==4.15.0",
    ]
    assert damaged({"changed": []}, lock) == damaged(None, lock) == []
    # a module whose import name is not its distribution's (yaml of pyyaml) is not guessed
    assert damaged({"changed": [sp + "yaml/_yaml.cpython-311-x86_64-linux-gnu.so"]}, lock) == []
