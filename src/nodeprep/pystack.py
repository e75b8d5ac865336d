"""What the Python-stack roles (wheelhouse, venv, torch, deepspeed_env) compute from the
fleet's facts, once per run and cached in run.shared: each node's wheel platform, the
absolute venv path, and the ONE torch build for the whole fleet."""
from __future__ import annotations

import posixpath

from .errors import NodeprepError
from .wheelhouse import Platform


def platform(facts: dict) -> Platform:
    py = facts.get("python")
    if not py:
        raise NodeprepError("no usable Python interpreter (see the inventory's `python`)")
    return Platform(facts["os"]["arch"], ".".join(py["version"].split(".")[:2]), py["glibc"] or "2.17")


def fleet_python(run) -> str | None:
    """The Python version most nodes have: the fleet's, for parity messages."""
    from collections import Counter
    versions = Counter(f["python"]["version"] for f in run.facts.values() if f.get("python"))
    return versions.most_common(1)[0][0] if versions else None


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
    from .remote import rpath
    p = rpath(path)
    return (f"if [ -x {p}/bin/python ]; then {p}/bin/python -I - <<'NODEPREP_PY'\n"
            "import sys, importlib.metadata as m\n"
            "print(sys.version.split()[0])\n"
            "for d in m.distributions():\n"
            "    print(d.metadata['Name'] + '==' + d.version)\n"
            "NODEPREP_PY\n"
            "else echo MISSING; fi")


def parse_venv(text: str, rc: int) -> dict:
    """{'exists', 'python' (version), 'packages': {canonical name: version}}."""
    from packaging.utils import canonicalize_name
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines or lines[0] == "MISSING":
        return {"exists": False, "python": None, "packages": {}}
    if rc != 0:
        return {"exists": True, "python": None, "packages": {}, "error": lines[-1][:200]}
    pkgs = {}
    for ln in lines[1:]:
        name, _, version = ln.partition("==")
        pkgs[canonicalize_name(name)] = version
    return {"exists": True, "python": lines[0], "packages": pkgs}


def _register():
    from .facts import fact
    fact("venv", _venv_script)(parse_venv)


_register()
