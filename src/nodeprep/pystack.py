"""What the Python-stack roles (wheelhouse, venv, torch, deepspeed_env) compute from the
fleet's facts, once per run and cached in run.shared: each node's wheel platform, the
absolute venv path, and the ONE torch build for the whole fleet."""
from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING

from .errors import NodeprepError

if TYPE_CHECKING:
    from .wheelhouse import Platform


def platform(facts: dict) -> Platform:
    py = facts.get("python")
    if not py:
        raise NodeprepError("no usable Python interpreter (see the inventory's `python`)")
    from .wheelhouse import Platform   # packaging.requirements: ~12 ms that verify never needs
    return Platform(facts["os"]["arch"], ".".join(py["version"].split(".")[:2]), py["glibc"] or "2.17")


def fleet_majority(run, what):
    """The value most nodes have (for parity messages naming both values); WHAT(node, facts)."""
    from collections import Counter
    values = Counter(what(n, f) for n, f in run.facts.items() if f.get("python"))
    return values.most_common(1)[0][0] if values else None


def fleet_python(run) -> str | None:
    """The fleet's Python version."""
    return fleet_majority(run, lambda n, f: f["python"]["version"])


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


def torch_plan(run):
    """The fleet's torch build (None when no node asks for torch); raises PlanError."""
    if "torch_plan" not in run.shared:
        from . import torchplan
        versions = {v["torch_version"] for v in run.vars.values() if v.get("torch_version")}
        if not versions:
            run.shared["torch_plan"] = None
            return None
        if len(versions) > 1:
            raise NodeprepError(f"torch_version differs between nodes ({', '.join(sorted(versions))}): "
                                "one build for the whole fleet keeps torch and NCCL identical")
        nodes = [torchplan.node_from_facts(name, f["os"]["arch"], f["gpus"], run.vars[name]["cpu_only"])
                 for name, f in run.facts.items() if "gpus" in f]
        template = next(iter(run.vars.values())).get("torch_index")
        own = template in (None, "pip-config")
        plan = torchplan.choose(versions.pop(), nodes) if own else \
            torchplan.choose(versions.pop(), nodes, template)
        if own:
            plan.index_url = None    # resolve from pip's own configuration (mirror, find-links)
        run.shared["torch_plan"] = plan
        run.notes.append(f"torch plan: {plan.requirement}" + (f" from {plan.index_url}" if plan.index_url else
                                                              " from pip's configured index"))
    return run.shared["torch_plan"]


def _venv_script(path: str) -> str:
    """No interpreter start (it cost ~0.1 s of CPU per node): the Python version from
    pyvenv.cfg and the packages from the *.dist-info directory names, which carry the
    normalized name and exact version (PEP 376/427)."""
    from .remote import rpath
    p = rpath(path)
    return (f"[ -x {p}/bin/python ] || {{ echo MISSING; exit 0; }}; "
            # the version line of pyvenv.cfg with sh builtins (was sed | head: two execs)
            f"v=; while IFS= read -r l || [ -n \"$l\" ]; do case $l in version_info*=*|'version '*=*|version=*) "
            "v=${l#*=}; break;; esac; done < " + f"{p}/pyvenv.cfg; printf '%s\\n' \"${{v:-?}}\"; "
            f"{p}/bin/python -I -S -c '' || echo @@BROKEN@@; "
            # parameter expansion, not basename: one fork per package cost ~25 ms a node
            f"for d in {p}/lib/python*/site-packages/*.dist-info; do [ -d \"$d\" ] && "
            "{ d=${d%.dist-info}; printf '%s\\n' \"${d##*/}\"; }; done")


def parse_venv(text: str, rc: int) -> dict:
    """{'exists', 'python' (version), 'packages': {canonical name: version}}."""
    from packaging.utils import canonicalize_name
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines or lines[0] == "MISSING":
        return {"exists": False, "python": None, "packages": {}}
    if "@@BROKEN@@" in lines:
        return {"exists": True, "python": None, "packages": {}, "error": "its python does not run"}
    pkgs = {}
    for ln in lines[1:]:
        name, _, version = ln.rpartition("-")
        if name:
            pkgs[canonicalize_name(name)] = version
    # virtualenv writes version_info = 3.8.10.final.0; venv writes version = 3.11.2
    return {"exists": True, "python": ".".join(lines[0].split(".")[:3]), "packages": pkgs}


def _register():
    from .facts import fact
    fact("venv", _venv_script)(parse_venv)


_register()


def requirement_pins(run) -> list[str]:
    """The pinned lines of `python_requirements` (relative paths: beside the inventory, then in
    the nodeprep checkout); InputError with file:line for anything unpinned. Called from the
    roles' validate(), so bad input stops the run before any node is touched."""
    if "pins" not in run.shared:
        from pathlib import Path

        from .settings import ROOT
        from .wheelhouse import read_requirements
        first = next(iter(run.vars.values()))
        base = Path(run.inventory.path).parent if run.inventory.path else ROOT
        paths = [Path(p).expanduser() for p in first["python_requirements"]]
        paths = [p if p.is_absolute() else (base / p if (base / p).exists() else ROOT / p) for p in paths]
        run.shared["pins"] = read_requirements(paths)
    return run.shared["pins"]


def wheelhouse_manifests(run) -> list:
    """Once per run: resolve (or, in --check, look up) the wheelhouse of every node platform;
    fills run.shared["manifests"] {node: (dir, manifest)} and run.shared["wheelhouse_errors"].
    Shared by the wheelhouse role (push) and the venv role (what to install), so either works
    alone with --roles. Returns the controller step results (once)."""
    if "manifests" in run.shared:
        return []
    from .errors import NodeprepError
    from .report import StepResult
    from .wheelhouse import Wheelhouse
    first = next(iter(run.vars.values()))
    plan = torch_plan(run)
    index = ["--extra-index-url", plan.index_url] if plan and plan.index_url else []
    pins = requirement_pins(run) + ([plan.requirement] if plan else []) + list(first["wheel_builds"] or {})
    house = Wheelhouse(run.settings.state / "wheelhouse")
    manifests = run.shared["manifests"] = {}
    errors = run.shared["wheelhouse_errors"] = {}
    # A node on another Python than the fleet is failed by the venv role (naming both
    # versions); resolving wheels for its platform would only add a second, confusing error.
    fleet_py = fleet_python(run)
    platforms = {n: platform(f) for n, f in run.facts.items()
                 if f.get("python") and f["python"]["version"] == fleet_py}
    built = None if run.check else house.build(first["wheel_builds"], plan.requirement if plan else None,
                                               index)
    results = []
    for p in sorted(set(platforms.values()), key=lambda p: p.key):
        name = f"wheelhouse.download {p.key}"
        if run.check:   # plan from the cache when it matches; never download in --check
            m = house.cached(p, pins, index)
            if m is None:
                results.append(StepResult(name, "changed", "would resolve and download"))
                continue
        else:
            try:
                m = house.resolve(p, pins, index, [built])
            except NodeprepError as e:   # fails this platform's nodes, not the whole fleet
                results.append(StepResult(name, "failed", str(e)))
                errors.update({n: str(e) for n, q in platforms.items() if q == p})
                continue
        fresh = house.downloads.get(p.key, 0) > 0
        results.append(StepResult(name, "changed" if fresh else "ok",
                                  f"{len(m['files'])} wheels " + ("downloaded" if fresh else "cached")))
        manifests.update({n: (house.root / p.key, m) for n, q in platforms.items() if q == p})
    return results
