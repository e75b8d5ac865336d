"""nccl: check the NCCL / aws-ofi-nccl / libfabric libraries exist on every node, and write the
`nccl` block of the env file every shell sources: LD_LIBRARY_PATH plus the NCCL_* / FI_*
settings, with an NCCL_SOCKET_IFNAME proposal when none is configured."""
from __future__ import annotations

import fnmatch
import re
import shlex

from nodeprep import ncclenv
from nodeprep.errors import InputError
from nodeprep.steps import Check, FileBlock, Step

ALLOWED = re.compile(r"^(NCCL_|FI_|OFI_NCCL_|TORCH_NCCL_)[A-Z0-9_]*$")
LIBS = {"nccl_home": ["libnccl.so.2"], "aws_ofi_nccl_home": ["libnccl-net*.so"],
        "libfabric_home": ["libfabric.so*"]}


def validate(run):
    for node, v in run.vars.items():
        for key in LIBS:
            if v[key] and not str(v[key]).startswith("/"):
                file, line = run.origin(node, key)
                raise InputError(f"{key}: {v[key]!r} is not an absolute path", hint="LD_LIBRARY_PATH "
                                 "and the DeepSpeed launcher do not expand ~ or relative paths",
                                 file=file, line=line)
        for k, val in (v["nccl_env"] or {}).items():
            file, line = run.origin(node, "nccl_env")
            if k.startswith("RDMAV_"):
                raise InputError(f"nccl_env.{k}: aws-ofi-nccl documents never setting RDMAV_* "
                                 "variables", hint="remove it", file=file, line=line)
            if not ALLOWED.match(str(k)):
                raise InputError(f"nccl_env.{k}: not an NCCL_*, FI_*, OFI_NCCL_* or TORCH_NCCL_* "
                                 "variable", hint="put other variables in deepspeed_env",
                                 file=file, line=line)
            if isinstance(val, (dict, list)) or "\n" in str(val):
                raise InputError(f"nccl_env.{k}: value must be a single-line scalar",
                                 file=file, line=line)


FACTS = ["interfaces"]


def reads(ctx):
    v = ctx.vars
    return [("dir", v[k].rstrip("/") + "/lib") for k in LIBS if v[k]] + [("file", v["env_file"])]


def controller(run):
    ncclenv.run_proposal(run)
    return []


def lib_step(home_var: str, home: str, pattern: str) -> Step:
    libdir = home.rstrip("/") + "/lib"

    def check(facts):
        entries = facts[f"dir:{libdir}"]
        if entries is None:
            return Check(False, f"{libdir} does not exist on this node")
        if not fnmatch.filter(entries, pattern):
            return Check(False, f"no {pattern} in {libdir}")
        return Check(True)
    return Step(f"nccl.library {pattern} in {libdir}", [("dir", libdir)], check, None,
                hint=f"install it there, or fix {home_var} in the inventory")


def env_block(env: dict[str, str]) -> str:
    lines = []
    for k, val in env.items():
        if k == "LD_LIBRARY_PATH":  # keep what the node already has after ours
            lines.append(f"export LD_LIBRARY_PATH={shlex.quote(val)}\"${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}\"")
        else:
            lines.append(f"export {k}={shlex.quote(val)}")
    return "\n".join(lines) + ("\n" if lines else "")


def steps(ctx):
    v = ctx.vars
    out = [lib_step(k, v[k], pat) for k, pats in LIBS.items() if v[k] for pat in pats]
    env = ncclenv.node_env(v, ncclenv.run_proposal(ctx.run))
    out.append(FileBlock(v["env_file"], "nccl", env_block(env), mode=0o600))
    return out
