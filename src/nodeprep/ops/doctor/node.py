"""First contact with the nodes, for `invoke doctor`: each check is a pure function of every
node's `Contact` (how the connection went, the facts one probe gathered) and returns
(node, code, verdict, reason, fix) tuples, the fix being the command that removes the
finding. A node that was not reached is UNKNOWN to every check but `reach`, `auth` and
`host_key` (connection.py), which say why."""

from __future__ import annotations

import os
import shlex
from dataclasses import KW_ONLY, dataclass, field

from nodeprep.engine import facts as factmod
from nodeprep.engine.facts.modules import problem
from nodeprep.ops.health.findings import Verdict
from nodeprep.ops.provision.room import human
from nodeprep.ops.provision.shells import want_shell

MIN_PYTHON = (3, 10)  # torch 2.13's wheels on PyPI: Requires-Python >=3.10
# What a first provision writes (wheels + venv), when no venv is there yet: the lab's CPU stack
# measured 219 MB of wheels and a 1007 MB venv (ops/provision/room.py, 2026-11-25); a CUDA torch
# with its nvidia-* wheels is about 3 GB of wheels (PyPI's file sizes for torch 2.x cu12), a
# venv of about 7 GB: 10 GiB asked of a GPU node.
NEED_CPU = int(1.5 * 2**30)
NEED_GPU = 10 * 2**30
NEED_UPDATE = 512 * 2**20  # a venv is there: a later provision replaces a few wheels
LAUNCH_PROGRAMS = {
    "pdsh": "deepspeed (the default launcher) starts every rank with pdsh from the "
    "run's first node, and any node can be first",
    "mpirun": "--launcher mpirun starts from the first node",
    "orted": "mpirun starts Open MPI's orted on every node over ssh, with the non-interactive PATH",
}


@dataclass
class Contact:
    name: str
    address: str
    port: int
    _: KW_ONLY
    user: str | None
    key: str | None
    vars: dict
    reached: bool
    error_kind: str = ""
    message: str = ""
    login: dict = field(default_factory=dict)
    facts: dict = field(default_factory=dict)
    inventory: str = ""  # how a fix command names the inventory (--inventory X)


def _unknown(c: Contact) -> tuple:
    return (
        c.name,
        "NOT_CHECKED",
        Verdict.UNKNOWN,
        "not reached: the fix is under reach, auth or host_key",
        "",
    )


def sudo(contacts: list[Contact]) -> list:
    out = []
    for c in contacts:
        if not c.reached:
            out.append(_unknown(c))
            continue
        cur, user = (
            c.facts.get(factmod.LOGIN_SHELL),
            (c.facts.get(factmod.USER) or {}).get("name", "?"),
        )
        want, got = want_shell(c.vars, cur), c.facts.get("sudo")
        if cur == want:
            out.append(
                (
                    c.name,
                    "SUDO_NOT_NEEDED",
                    Verdict.OK,
                    f"login shell already {want}: no role needs sudo",
                    "",
                )
            )
        elif got in ("root", "all", "usermod"):
            out.append(
                (
                    c.name,
                    "SUDO_OK",
                    Verdict.OK,
                    f"the login shell change to {want} can run ({got})",
                    "",
                )
            )
        elif got is None:
            out.append(
                (
                    c.name,
                    "SUDO_UNKNOWN",
                    Verdict.UNKNOWN,
                    "sudo did not answer",
                    "rerun invoke doctor -v",
                )
            )
        else:
            why = (
                "no sudo program" if got == "missing" else "sudo asks a password or refuses usermod"
            )
            out.append(
                (
                    c.name,
                    "SUDO_MISSING",
                    Verdict.CRITICAL,
                    f"the shell role must change the login shell {cur} -> {want} and cannot: {why}",
                    f"as root on {c.name}: usermod -s {want} {user}  "
                    f"(or set login_shell: {cur} in the inventory)",
                )
            )
    return out


def _pyver(p: dict | None) -> tuple:
    try:
        return tuple(int(x) for x in (p or {}).get("version", "").split(".")[:2])
    except ValueError:
        return ()


def python(contacts: list[Contact]) -> list:
    out, seen = [], {}
    for c in contacts:
        if c.reached and c.facts.get(factmod.PYTHON):
            seen.setdefault(c.facts[factmod.PYTHON]["version"].rsplit(".", 1)[0], []).append(c.name)
    most = max(seen, key=lambda k: len(seen[k])) if seen else None
    for c in contacts:
        if not c.reached:
            out.append(_unknown(c))
            continue
        p, name = c.facts.get(factmod.PYTHON), c.vars.get("python") or "python3"
        if not p:
            out.append(
                (
                    c.name,
                    "PYTHON_MISSING",
                    Verdict.CRITICAL,
                    f"`{name}` does not run on the node",
                    f"on {c.name}: sudo apt-get install -y python3 (or dnf); "
                    "or set python: /path/to/python3",
                )
            )
        elif _pyver(p) < MIN_PYTHON:
            out.append(
                (
                    c.name,
                    "PYTHON_OLD",
                    Verdict.CRITICAL,
                    f"{p['path']} is Python {p['version']}; torch "
                    f"needs {MIN_PYTHON[0]}.{MIN_PYTHON[1]}+",
                    "set python: to a newer interpreter on the node",
                )
            )
        elif len(seen) > 1 and not p["version"].startswith(most + "."):
            out.append(
                (
                    c.name,
                    "PYTHON_MISMATCH",
                    Verdict.WARN,
                    f"Python {p['version']} here, {most} on "
                    f"{len(seen[most])} other node(s): one venv per fleet",
                    "set python: to the same version on every node",
                )
            )
        else:
            out.append((c.name, "PYTHON_OK", Verdict.OK, f"{p['path']} {p['version']}", ""))
    return out


def modules(contacts: list[Contact]) -> list:
    """Where the inventory names `modules`: each loads on the node as its shells will load it
    (the MODULES fact; the same rule as provision's modules step and health's check)."""
    out = []
    for c in contacts:
        names = list(c.vars.get("modules") or [])
        if not names:
            continue
        if not c.reached:
            out.append(_unknown(c))
            continue
        m = c.facts.get(factmod.MODULES)
        if m is None:
            out.append(
                (
                    c.name,
                    "MODULES_UNKNOWN",
                    Verdict.UNKNOWN,
                    "the modules probe gave no answer",
                    f"invoke health{c.inventory} --check modules",
                )
            )
            continue
        bad = problem(m, c.vars)
        if bad is None:
            what = ", ".join(m.get("loaded") or names)
            out.append((c.name, "MODULES_OK", Verdict.OK, f"{what} load ({m.get('system')})", ""))
        else:
            code = "MODULES_NO_SYSTEM" if m.get("system") is None else "MODULE_NOT_LOADED"
            out.append((c.name, code, Verdict.CRITICAL, bad[0], bad[1]))
    return out


def _path_fix(c: Contact, program: str, found: str | None) -> str:
    if found:
        d = shlex.quote(found.rsplit("/", 1)[0])
        shell = os.path.basename(c.facts.get(factmod.LOGIN_SHELL) or "bash")
        rc = "~/.zshenv" if shell == "zsh" else "~/.bashrc"
        return (
            f"on {c.name}: {{ echo 'export PATH={d}:$PATH'; cat {rc} 2>/dev/null; }} > {rc}.np && "
            f"mv {rc}.np {rc}  (the top of {rc}: before any 'not interactive: return')"
        )
    release = (c.facts.get(factmod.OS) or {}).get("release") or ""
    pkg = {"pdsh": "pdsh", "mpirun": "openmpi-bin", "orted": "openmpi-bin"}[program]
    if any(
        n in release for n in ("Red Hat", "Rocky", "AlmaLinux", "CentOS", "Fedora", "Amazon Linux")
    ):
        pkg = {"pdsh": "pdsh pdsh-rcmd-ssh", "mpirun": "openmpi", "orted": "openmpi"}[program]
        return f"on {c.name}: sudo dnf install -y {pkg}"
    return f"on {c.name}: sudo apt-get install -y {pkg}"


def launchers(contacts: list[Contact]) -> list:
    """pdsh on every node; mpirun and orted on every node once any node has mpirun."""
    reached = [c for c in contacts if c.reached]
    mpi = any("mpirun" in (c.facts.get(factmod.PROGRAMS) or ()) for c in reached)
    wanted = ["pdsh"] + (["mpirun", "orted"] if mpi else [])
    out = []
    for c in contacts:
        if not c.reached:
            out.append(_unknown(c))
            continue
        have = c.facts.get(factmod.PROGRAMS) or set()
        lacking = [p for p in wanted if p not in have]
        for p in lacking:
            found = (c.facts.get("login_finds") or {}).get(p)
            where = f"; a login shell finds it at {found}" if found else ""
            out.append(
                (
                    c.name,
                    "NOT_ON_PATH",
                    Verdict.WARN,
                    f"{p} is not on the non-interactive PATH{where}: {LAUNCH_PROGRAMS[p]}",
                    _path_fix(c, p, found),
                )
            )
        if not lacking:
            out.append(
                (
                    c.name,
                    "PROGRAMS_OK",
                    Verdict.OK,
                    ", ".join(wanted) + " on the non-interactive PATH",
                    "",
                )
            )
    return out


def disk(contacts: list[Contact]) -> list:
    out = []
    for c in contacts:
        if not c.reached:
            out.append(_unknown(c))
            continue
        room = c.facts.get("room") or {}
        venv = c.facts.get("venv") or {}
        gpu = bool((c.facts.get(factmod.GPUS) or {}).get("count"))
        need = NEED_UPDATE if venv.get("exists") else NEED_GPU if gpu else NEED_CPU
        what = "a later provision" if venv.get("exists") else "a first provision (wheels + venv)"
        if not room:
            out.append(
                (
                    c.name,
                    "DISK_UNKNOWN",
                    Verdict.UNKNOWN,
                    "the file system of the venv could not be read",
                    "rerun invoke doctor -v",
                )
            )
        elif room.get("readonly") or not room.get("writable"):
            out.append(
                (
                    c.name,
                    "DISK_READONLY",
                    Verdict.CRITICAL,
                    f"{room['dir']} on {room['mount']} cannot be written",
                    "fix its owner/mode or remount it read-write; "
                    "or set venv_path and wheelhouse_dir elsewhere",
                )
            )
        elif room["free"] < need:
            out.append(
                (
                    c.name,
                    "DISK_LOW",
                    Verdict.CRITICAL,
                    f"{human(room['free'])} free on {room['mount']}, "
                    f"{what} needs about {human(need)}",
                    f"on {c.name}: free space on {room['mount']} "
                    "(du -sh ~/.cache/pip ~/.nodeprep/* | sort -h; rm -rf ~/.cache/pip), "
                    "or set venv_path and wheelhouse_dir on a larger file system",
                )
            )
        else:
            out.append(
                (
                    c.name,
                    "DISK_OK",
                    Verdict.OK,
                    f"{human(room['free'])} free on {room['mount']} ({what}: about {human(need)})",
                    "",
                )
            )
    return out
