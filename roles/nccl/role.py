"""nccl: check the NCCL / aws-ofi-nccl / libfabric libraries exist on every node, and write the
`nccl` block of the env file every shell sources: LD_LIBRARY_PATH plus the NCCL_* / FI_*
settings, with an NCCL_SOCKET_IFNAME proposal when none is configured."""

from __future__ import annotations

import fnmatch
import re
import shlex

from nodeprep.engine.facts import DIR, ELF_ARCH, FILE, INTERFACES, OS, ROUTE
from nodeprep.engine.steps import FileBlock, Step, StepCheck
from nodeprep.errors import InputError
from nodeprep.ops.launchenv import ncclenv

ALLOWED = re.compile(r"^(NCCL_|FI_|OFI_NCCL_|TORCH_NCCL_)[A-Z0-9_]*$")
LIBS = {
    "nccl_home": ["libnccl.so.2"],
    "aws_ofi_nccl_home": ["libnccl-net*.so"],
    "libfabric_home": ["libfabric.so*"],
}


def validate(prov):
    for node, v in prov.vars.items():
        for key in LIBS:
            if v[key] and not str(v[key]).startswith("/"):
                file, line = prov.origin(node, key)
                raise InputError(
                    f"{key}: {v[key]!r} is not an absolute path",
                    hint="LD_LIBRARY_PATH "
                    "and the DeepSpeed launcher do not expand ~ or relative paths",
                    file=file,
                    line=line,
                )
        for k, val in (v["nccl_env"] or {}).items():
            file, line = prov.origin(node, "nccl_env")
            if k.startswith("RDMAV_"):
                raise InputError(
                    f"nccl_env.{k}: aws-ofi-nccl documents never setting RDMAV_* variables",
                    hint="remove it",
                    file=file,
                    line=line,
                )
            if not ALLOWED.match(str(k)):
                raise InputError(
                    f"nccl_env.{k}: not an NCCL_*, FI_*, OFI_NCCL_* or TORCH_NCCL_* variable",
                    hint="put other variables in deepspeed_env",
                    file=file,
                    line=line,
                )
            if isinstance(val, (dict, list)):  # control characters: inventory.fields
                raise InputError(
                    f"nccl_env.{k}: value must be a single-line scalar", file=file, line=line
                )


FACTS = [INTERFACES, OS]


def reads(ctx):
    v = ctx.vars
    # how this node reaches the head: the interface NCCL should use (ncclenv.run_proposal)
    libdirs = [v[k].rstrip("/") + "/lib" for k in LIBS if v[k]]
    return (
        [DIR(d) for d in libdirs]
        + [ELF_ARCH(d) for d in libdirs]
        + [FILE(v["env_file"])]
        + [ROUTE(ctx.prov.hosts[0].address)]
    )


def controller(prov):
    ncclenv.run_proposal(prov)
    return []


def lib_step(home_var: str, home: str, pattern: str, arch: str | None = None) -> Step:
    """PATTERN must be in HOME/lib, built for this node's CPU ARCH (its loader cannot load
    another platform's library: a mixed fleet needs that platform's build at its path)."""
    libdir = home.rstrip("/") + "/lib"

    def check(facts):
        entries = facts[DIR(libdir)]
        if entries is None:
            return StepCheck(False, f"{libdir} does not exist on this node")
        found = fnmatch.filter(entries, pattern)
        if not found:
            return StepCheck(False, f"no {pattern} in {libdir}")
        # judged by their ELF header; a file that is not ELF (a linker script, a stand-in) is not
        built = {n: a for n, a in (facts.get(ELF_ARCH(libdir)) or {}).items() if a != "not ELF"}
        other = {n: built[n] for n in found if n in built and arch and built[n] != arch}
        if other and len(other) == len([n for n in found if n in built]):
            name, what = next(iter(sorted(other.items())))
            return StepCheck(
                False, f"{libdir}/{name} is {what}, this node is {arch}: its loader cannot load it"
            )
        return StepCheck(True)

    return Step(
        f"nccl.library {pattern} in {libdir}",
        [DIR(libdir), ELF_ARCH(libdir)],
        check,
        action=None,
        hint=f"install it there ({arch or 'this node'}'s build), or fix {home_var} in the "
        "inventory (per platform: a group of that platform's nodes)",
    )


def env_block(env: dict[str, str]) -> str:
    lines = []
    for k, val in env.items():
        if k == "LD_LIBRARY_PATH":  # keep what the node already has after ours
            lines.append(
                f"export LD_LIBRARY_PATH={shlex.quote(val)}"
                '"${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"'
            )
        else:
            lines.append(f"export {k}={shlex.quote(val)}")
    return "\n".join(lines) + ("\n" if lines else "")


def steps(ctx):
    v = ctx.vars
    arch = (ctx.facts.get(OS) or {}).get("arch")
    out = [lib_step(k, v[k], pat, arch) for k, pats in LIBS.items() if v[k] for pat in pats]
    env = ncclenv.node_env(v, ncclenv.run_proposal(ctx.prov).get(ctx.name))
    out.append(FileBlock(v["env_file"], "nccl", env_block(env), mode=0o600))
    return out
