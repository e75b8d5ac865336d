"""Paths of the Python stack on a node: `~` resolved with the node's home, the venv's absolute
path, and the PATH a launcher's ranks get. Pure: facts and variables in, strings out."""
from __future__ import annotations

import posixpath


def node_path(p: str, facts: dict) -> str:
    """P as an absolute path on this node (`~` resolved with the node's home)."""
    if p == "~" or p.startswith("~/"):
        p = facts["user"]["home"].rstrip("/") + p[1:]
    return posixpath.normpath(p)


def venv_path(v: dict, facts: dict) -> str:
    return node_path(v["venv_path"], facts)


def path_env(v: dict, facts: dict) -> dict[str, str]:
    """PATH for ranks started by a launcher (which does not forward PATH)."""
    return {"PATH": f"{venv_path(v, facts)}/bin:/usr/local/bin:/usr/bin:/bin"}
