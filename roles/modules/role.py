"""modules: every node loads the inventory's environment modules, and each one loads there
(issue 46; the MODULES fact reads them as the ranks' shells will). A node where a named module
does not load fails here, before a later role changes anything on it; the others go on."""

from __future__ import annotations

import re

from nodeprep.engine.facts import FILE, MODULES
from nodeprep.engine.facts.modules import load_snippet, problem
from nodeprep.engine.steps import FileBlock, Step, StepCheck
from nodeprep.errors import InputError

# A module name as sites write them: cuda/12.6, cray-python/3.11.7, PrgEnv-gnu, gcc/13.2.0+x
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*(/[A-Za-z0-9._+-]+)*")
PATH = re.compile(r"/[A-Za-z0-9._+@=,:/-]*")


def _refuse(prov, node: str, var: str, why: str, hint: str):
    file, line = prov.origin(node, var)
    raise InputError(f"{var}: {why}", hint=hint, file=file, line=line)


def validate(prov):
    for node, v in prov.vars.items():
        mods, paths, init = v.get("modules"), v.get("module_path"), v.get("module_init")
        for var, value in (("modules", mods), ("module_path", paths)):
            if value is not None and not isinstance(value, list):
                _refuse(prov, node, var, f"{str(value)[:60]!r} is not a list", "write [a, b]")
        for m in mods or []:
            if not isinstance(m, str) or not NAME.fullmatch(m):
                _refuse(
                    prov,
                    node,
                    "modules",
                    f"{str(m)[:60]!r} is not a module name",
                    "as `module load` takes it: cuda/12.6, cray-python/3.11.7",
                )
        for p in paths or []:
            if not isinstance(p, str) or not PATH.fullmatch(p):
                _refuse(
                    prov,
                    node,
                    "module_path",
                    f"{str(p)[:60]!r} is not an absolute directory path",
                    "as `module use` takes it: /opt/site/modulefiles",
                )
        if init is not None and (not isinstance(init, str) or not PATH.fullmatch(init)):
            _refuse(
                prov,
                node,
                "module_init",
                f"{str(init)[:60]!r} is not an absolute path",
                "the file that defines `module`, e.g. /usr/share/lmod/lmod/init/profile",
            )


def reads(ctx):
    return [MODULES, FILE(ctx.vars["env_file"])] if ctx.vars.get("modules") else []


def steps(ctx):
    v = ctx.vars
    if not v.get("modules"):
        return []

    def check(facts) -> StepCheck:
        p = problem(facts.get(MODULES.key), v)
        return StepCheck(True) if p is None else StepCheck(False, p[0])

    p = problem(ctx.facts.get(MODULES.key), v)
    return [
        Step(
            f"modules.load {' '.join(v['modules'])}",
            [MODULES],
            check,
            action=None,
            hint=p[1] if p else "",
        ),
        # every shell that sources the env file (the shell role: logins, and the
        # non-interactive ones pdsh and mpirun start) loads them, before the venv's PATH
        FileBlock(v["env_file"], "modules", load_snippet(v), mode=0o600, where="first"),
    ]
