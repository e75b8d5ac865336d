"""Environment modules on the lab's nodes (`lab.up --modules lmod|tcl`, issue 46): the module
systems HPC sites run, from Debian's packages, and a software tree whose modulefiles matter.

- tcl: Environment Modules 5.2 (Debian's environment-modules, installed on the host by the
  bootstrap; nodes share the host's /usr). Its /etc/profile.d/modules.sh is in each node's /etc.
- lmod: Lmod 8.6 (Debian's lmod conflicts with environment-modules, so the bootstrap unpacks its
  .deb into LMOD_ROOT): each node bind-mounts LMOD_ROOT's /usr/share/lmod and /usr/lib/lmod at
  those paths in its own mount namespace, and its /etc gets lmod.sh and /etc/lmod instead of
  modules.sh. The host keeps empty directories there as mount points.

The tree (TREE, shared by every node like /usr): `python/3.11` puts an interpreter that is on no
default PATH first (TREE/sw/python/3.11/bin/python3, the host's own CPython 3.11) and sets
NP_LAB_PYTHON_MODULE; `cray-python/3.11.7` is seed 003's own name, a Python as Cray's is: its
interpreter (a copy of the host's CPython 3.11 that patchelf made need CRAYPY_LIB, kept in the
module's lib/) runs only with the LD_LIBRARY_PATH its module sets, and so does a venv made by it;
`cuda/12.6` and `cuda/12.4` set CUDA_HOME, prepend its bin/ (an `nvcc`
that prints its release as the real one does) and lib64/ to PATH and LD_LIBRARY_PATH, and set
NP_LAB_CUDA. None of it is on the default MODULEPATH: an inventory names it with `module_path`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from nodeprep.errors import NodeprepError

from . import net

SYSTEMS = ("lmod", "tcl")
LMOD_ROOT = Path("/var/lib/nodeprep/lmod")  # unpacked by requirements/bootstrap.sh
TREE = Path("/var/lib/nodeprep/lab-modules")
MODULEFILES = TREE / "modulefiles"
BINDS = ("usr/share/lmod", "usr/lib/lmod")
CUDAS = ("12.6", "12.4")
CRAYPY = TREE / "sw" / "cray-python" / "3.11.7"
CRAYPY_LIB = "libnp-craypy.so.1"  # what its python needs, found only on the module's path

NVCC = """#!/bin/sh
# nodeprep lab: a stand-in nvcc (lab/modules.py); the first lines as CUDA's own nvcc prints them
echo "nvcc: NVIDIA (R) Cuda compiler driver"
echo "Cuda compilation tools, release {v}, V{v}.0"
"""


def _python_module() -> str:
    return (
        "#%Module1.0\n"
        "## nodeprep lab (lab/modules.py): a Python on no default PATH\n"
        'module-whatis "CPython 3.11 (the lab\'s)"\n'
        f"prepend-path PATH {TREE}/sw/python/3.11/bin\n"
        "setenv NP_LAB_PYTHON_MODULE 3.11\n"
    )


def _craypy_module() -> str:
    return (
        "#%Module1.0\n"
        "## nodeprep lab (lab/modules.py): a Python that needs its module's LD_LIBRARY_PATH\n"
        'module-whatis "Cray Python 3.11.7 (the lab\'s stand-in)"\n'
        "conflict cray-python\n"
        f"prepend-path PATH {CRAYPY}/bin\n"
        f"prepend-path LD_LIBRARY_PATH {CRAYPY}/lib\n"
        "setenv NP_LAB_PYTHON_MODULE cray-python/3.11.7\n"
    )


def _craypy() -> bool:
    """CRAYPY's interpreter: /usr/bin/python3.11 copied, made by patchelf to need CRAYPY_LIB
    (a copy of glibc's small libutil stub under that soname) beside it in lib/; True when made.
    Built aside and renamed, so a cut build is made again."""
    py = CRAYPY / "bin" / "python3.11"
    if py.is_file() and (CRAYPY / "lib" / CRAYPY_LIB).is_file():
        return False
    stub = next(iter(sorted(Path("/usr/lib").glob("*-linux-gnu/libutil.so.1"))), None)
    if stub is None or not Path("/usr/bin/python3.11").is_file():
        raise NodeprepError(
            "lab --modules: the lab's Python modules copy /usr/bin/python3.11 and "
            "/usr/lib/*-linux-gnu/libutil.so.1: one is missing",
            hint="run requirements/bootstrap.sh (python3, Debian 12's 3.11)",
        )
    new = CRAYPY.with_name(CRAYPY.name + ".new")
    shutil.rmtree(new, ignore_errors=True)
    (new / "bin").mkdir(parents=True)
    (new / "lib").mkdir()
    shutil.copy2("/usr/bin/python3.11", new / "bin" / "python3.11")
    shutil.copy2(stub, new / "lib" / CRAYPY_LIB)
    (new / "bin" / "python3").symlink_to("python3.11")
    for argv in (
        ["patchelf", "--set-soname", CRAYPY_LIB, str(new / "lib" / CRAYPY_LIB)],
        ["patchelf", "--add-needed", CRAYPY_LIB, str(new / "bin" / "python3.11")],
    ):
        r = subprocess.run(argv, capture_output=True, text=True)
        if r.returncode:
            raise NodeprepError(
                f"lab --modules: {' '.join(argv[:2])} failed: {r.stderr.strip()[:200]}",
                hint="run requirements/bootstrap.sh (patchelf)",
            )
    shutil.rmtree(CRAYPY, ignore_errors=True)
    new.rename(CRAYPY)
    return True


def _cuda_module(v: str) -> str:
    home = TREE / "sw" / "cuda" / v
    return (
        "#%Module1.0\n"
        "## nodeprep lab (lab/modules.py): a CUDA toolkit's variables (no GPU code)\n"
        f'module-whatis "CUDA {v} (the lab\'s stand-in)"\n'
        "conflict cuda\n"
        f"setenv CUDA_HOME {home}\n"
        f"setenv NP_LAB_CUDA {v}\n"
        f"prepend-path PATH {home}/bin\n"
        f"prepend-path LD_LIBRARY_PATH {home}/lib64\n"
    )


def files() -> dict[Path, tuple[str, int]]:
    """The tree's files: path -> (text, mode)."""
    out = {
        MODULEFILES / "python" / "3.11": (_python_module(), 0o644),
        MODULEFILES / "cray-python" / "3.11.7": (_craypy_module(), 0o644),
    }
    for v in CUDAS:
        out[MODULEFILES / "cuda" / v] = (_cuda_module(v), 0o644)
        out[TREE / "sw" / "cuda" / v / "bin" / "nvcc"] = (NVCC.format(v=v), 0o755)
        out[TREE / "sw" / "cuda" / v / "version.json"] = (
            f'{{"cuda": {{"name": "CUDA SDK", "version": "{v}.0"}}}}\n',
            0o644,
        )
    return out


def require(system: str) -> None:
    if system not in SYSTEMS:
        raise NodeprepError(f"lab --modules {system!r}: one of {', '.join(SYSTEMS)}")
    need = (
        LMOD_ROOT / "usr/share/lmod/lmod/libexec/lmod"
        if system == "lmod"
        else Path("/usr/share/modules/init/sh")
    )
    if not need.exists():
        raise NodeprepError(
            f"lab --modules {system}: {need} missing",
            hint="run requirements/bootstrap.sh (environment-modules, and lmod unpacked)",
        )


def write_tree() -> bool:
    """The shared tree (TREE); True when something was written."""
    changed = False
    for path, (text, mode) in files().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        changed |= net.write_if_changed(path, text, mode)
    py = TREE / "sw" / "python" / "3.11" / "bin" / "python3"
    if not py.is_symlink():
        py.parent.mkdir(parents=True, exist_ok=True)
        py.symlink_to("/usr/bin/python3.11")
        changed = True
    changed |= _craypy()
    for v in CUDAS:
        (TREE / "sw" / "cuda" / v / "lib64").mkdir(parents=True, exist_ok=True)
    for d in [TREE, *TREE.rglob("*")]:
        if d.is_dir():
            d.chmod(0o755)
    return changed


def node_etc(etc: Path, system: str | None) -> bool:
    """A node's /etc for SYSTEM (None: as the host's copy left it); True when it changed."""
    if system is None:
        return False
    changed = False
    lmod_sh, tcl_sh = etc / "profile.d" / "lmod.sh", etc / "profile.d" / "modules.sh"
    if system == "lmod":
        for src, dst in ((LMOD_ROOT / "etc/profile.d/lmod.sh", lmod_sh),):
            if not dst.is_file() or dst.read_bytes() != src.read_bytes():
                shutil.copyfile(src, dst)
                changed = True
        if not (etc / "lmod").is_dir():
            shutil.copytree(LMOD_ROOT / "etc/lmod", etc / "lmod")
            changed = True
        drop = tcl_sh
    else:
        if not tcl_sh.is_file():
            shutil.copyfile("/etc/profile.d/modules.sh", tcl_sh)
            changed = True
        drop = lmod_sh
    if drop.exists():
        drop.unlink()
        changed = True
    return changed


def converge(nodes: list, system: str | None, changes: list[str]) -> None:
    """The tree and each native node's /etc for SYSTEM."""
    if system is None:
        return
    require(system)
    if write_tree():
        changes.append(f"wrote the lab's module tree {TREE}")
    for node in nodes:
        if not node.arch and node_etc(node.home.parent / "etc", system):
            changes.append(f"{node.name}: /etc for {system} modules")


def prepare(pid: int, system: str | None) -> None:
    """Inside node PID: Lmod's files bound at their paths (lmod), nothing else."""
    if system != "lmod":
        return
    script = "; ".join(
        f"mountpoint -q /{rel} || mount --bind {LMOD_ROOT / rel} /{rel}" for rel in BINDS
    )
    for rel in BINDS:
        os.makedirs(f"/{rel}", exist_ok=True)  # the host's empty mount points
    r = subprocess.run(
        ["nsenter", "-t", str(pid), "-m", "--", "/bin/sh", "-c", "set -e; " + script],
        capture_output=True,
        text=True,
    )
    if r.returncode:
        raise NodeprepError(f"binding Lmod into a lab node failed: {r.stderr.strip()[:300]}")


def prepare_all(nodes: list, system: str | None, pid_of) -> None:
    for node in nodes:
        pid = pid_of(node)
        if not node.arch and pid is not None:
            prepare(pid, system)
