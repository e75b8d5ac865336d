"""Paths of the Python stack on a node: `~` resolved with the node's home, the venv's absolute
path, and the PATH a launcher's ranks get. Pure: facts and variables in, strings out."""

from __future__ import annotations

import posixpath

from nodeprep.engine.facts.modules import BASE_PATH, set_by_modules


def node_path(p: str, facts: dict) -> str:
    """P as an absolute path on this node (`~` resolved with the node's home)."""
    if p == "~" or p.startswith("~/"):
        p = facts["user"]["home"].rstrip("/") + p[1:]
    return posixpath.normpath(p)


def venv_path(v: dict, facts: dict) -> str:
    return node_path(v["venv_path"], facts)


def path_env(v: dict, facts: dict) -> dict[str, str]:
    """PATH for ranks started by a launcher (which does not forward PATH): the venv's bin, then
    the PATH the node's `modules` make (the MODULES fact), else the system's."""
    mods = set_by_modules(v, facts)
    return {"PATH": f"{venv_path(v, facts)}/bin:{mods.get('PATH') or BASE_PATH}"}


# In the venv: the stamp of the last `import torch` that passed there (the torch role's verify
# writes it, engine/remote.stamp_from_list; the STAMP fact reads it): what was verified, on which
# CPU, and every file whose change could break the import, as it was then.
VERIFIED = ".nodeprep-verified"


def verified_stamp(venv: str) -> str:
    """The path of VENV's stamp (VENV as the inventory writes it: `~/` kept)."""
    return posixpath.join(venv, VERIFIED)


def damaged(stamp: dict | None, lock: list[str]) -> list[str]:
    """The pins of LOCK whose files the stamp lists as changed since the last import passed
    (site-packages/<name>/..., <name>.libs/..., <name>-<version>.dist-info/RECORD): pip keeps a
    package whose version matches, so these are reinstalled by force."""
    from packaging.utils import canonicalize_name

    tops = set()
    for path in (stamp or {}).get("changed") or ():
        parts = path.split("/")
        if "site-packages" in parts[:-1]:
            top = parts[parts.index("site-packages") + 1]
            top = top.split("-")[0] if top.endswith(".dist-info") else top.removesuffix(".libs")
            tops.add(canonicalize_name(top.removesuffix(".py")))
    return [p for p in lock if canonicalize_name(p.split("==")[0]) in tops]
