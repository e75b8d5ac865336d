"""Which CPU a venv's wheels were built for: a wheel's platform tag (PEP 425, as pip records it
in each package's WHEEL file, read by the VENV fact) names it, and a venv whose compiled
packages are for another CPU than the node's cannot import them there (seen: an x86_64 venv
in a home shared with aarch64 nodes, where pip kept the x86_64 numpy because its version
matched). Pure: facts in, names out."""

from __future__ import annotations

import re

# manylinux_2_17_x86_64, manylinux2014_aarch64, manylinux1_x86_64, musllinux_1_2_aarch64,
# linux_x86_64 (a wheel built on the node from an sdist)
_LINUX = re.compile(r"(?:many|musl)?linux(?:1|2010|2014|_\d+_\d+)?_(.+)")


def tag_arch(platform_tag: str) -> str:
    """The CPU a platform tag is for (`uname -m`'s word on Linux), or the tag itself for a
    non-Linux one (win_amd64, macosx_11_0_arm64), which no Linux node can load."""
    m = _LINUX.fullmatch(platform_tag)
    return m.group(1) if m else platform_tag


def foreign_packages(venv: dict | None, arch: str | None) -> dict[str, list[str]]:
    """{package: the CPUs its wheel was built for} for each package of VENV (the VENV fact)
    that no tag of its wheel makes loadable on a node of ARCH; {} when it cannot tell."""
    if not venv or not arch:
        return {}
    out = {}
    for name, tags in (venv.get("platforms") or {}).items():
        archs = sorted({tag_arch(t) for t in tags})
        if archs and arch not in archs:
            out[name] = archs
    return out


FIRST = ("numpy", "torch")  # named first in messages


def describe(foreign: dict[str, list[str]], limit: int = 4) -> tuple[str, str]:
    """('numpy, torch', 'x86_64') for messages: the packages (the first LIMIT, those a
    training job imports first), the CPUs."""
    names = sorted(foreign, key=lambda n: (n not in FIRST, FIRST.index(n) if n in FIRST else 0, n))
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more, ", ".join(
        sorted({a for v in foreign.values() for a in v})
    )
