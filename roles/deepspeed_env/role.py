"""deepspeed_env: ~/.deepspeed_env on every node, made only of bare single-line KEY=VALUE lines
(the DeepSpeed runner does `key, val = line.split('=', 1)` on every line: a blank line, a
comment or `export` breaks it), from the nccl role's environment plus `deepspeed_env`."""

from __future__ import annotations

import re

from nodeprep.engine.facts import FILE, INTERFACES, MODULES, USER
from nodeprep.engine.facts.modules import set_by_modules
from nodeprep.engine.steps import FileContent
from nodeprep.errors import InputError, NodeprepError
from nodeprep.ops import pystack
from nodeprep.ops.launchenv import dsenv, ncclenv
from nodeprep.redact import is_secret

IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def validate(prov):
    for node, v in prov.vars.items():
        file, line = prov.origin(node, "deepspeed_env")
        for k, val in (v["deepspeed_env"] or {}).items():
            if not IDENT.match(str(k)):
                raise InputError(
                    f"deepspeed_env key {k!r} is not a shell identifier",
                    hint="use letters, digits and _ only, not starting with a digit",
                    file=file,
                    line=line,
                )
            if isinstance(val, (dict, list)) or val is None:
                raise InputError(
                    f"deepspeed_env.{k}: value must be a string or number", file=file, line=line
                )
        for var, label, value in _feeds(v):
            problems = dsenv.value_problems(value, "pdsh")
            if problems:
                raise InputError(
                    f"{label}: {problems[0]} (it goes into ~/.deepspeed_env, which "
                    f"DeepSpeed 0.19.8's pdsh launcher runs as {dsenv.PDSH_EXPORT})",
                    file=prov.origin(node, var)[0],
                    line=prov.origin(node, var)[1],
                )


def _feeds(v: dict):
    """(variable, label, text) of every inventory value that ends up in ~/.deepspeed_env as
    written; venv_path's `~/` becomes the node's home first, so only the rest is checked."""
    for var in ("deepspeed_env", "nccl_env"):
        for k, val in (v[var] or {}).items():
            yield var, f"{var}.{k}", str(val).lower() if isinstance(val, bool) else str(val)
    for var in ("nccl_home", "aws_ofi_nccl_home", "libfabric_home", "venv_path"):
        text = str(v.get(var) or "")
        yield var, var, text[2:] if text.startswith("~/") else text


FACTS = [INTERFACES, USER]


def reads(ctx):
    return [FILE("~/.deepspeed_env")] + ([MODULES] if ctx.vars.get("modules") else [])


def content(env: dict[str, str]) -> str:
    return "".join(f"{k}={val}\n" for k, val in env.items())


def node_env(ctx) -> dict[str, str]:
    v = ctx.vars
    proposal = ncclenv.run_proposal(ctx.prov)
    # DeepSpeed's runner exports the head's ~/.deepspeed_env to every rank: a value that
    # differs per node stays in each node's own env file (nccl role) instead
    own = proposal.get(ctx.name) if ncclenv.fleet_wide(proposal) else None
    env = ncclenv.node_env(v, own)
    # what the node's `modules` set (the runner runs no `module load` on the ranks' nodes):
    # their values, LD_LIBRARY_PATH after the NCCL libraries'
    for k, val in set_by_modules(v, ctx.facts).items():
        if k != "PATH":
            env[k] = f"{env[k]}:{val}" if k == "LD_LIBRARY_PATH" and env.get(k) else val
    env.update(pystack.path_env(v, ctx.facts))  # the launcher does not forward PATH
    for k, val in (v["deepspeed_env"] or {}).items():
        env[k] = str(val).lower() if isinstance(val, bool) else str(val)
    return env


def steps(ctx):
    env = node_env(ctx)
    for k, val in env.items():  # values computed from facts too (interface names, home)
        if dsenv.pdsh_live(val) or "\n" in val or "\r" in val:
            raise NodeprepError(
                f"~/.deepspeed_env: the value of {k} computed for this node "
                f"contains characters DeepSpeed's pdsh launcher would run "
                f"({dsenv.PDSH_EXPORT}); nothing written",
                "set it literally in deepspeed_env or nccl_env",
            )
    hidden = [val for k, val in env.items() if is_secret(k)]
    return [FileContent("~/.deepspeed_env", content(env), 0o600, secrets=hidden)]
