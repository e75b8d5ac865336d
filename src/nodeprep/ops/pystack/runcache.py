"""The per-run cache of the Python-stack roles (wheelhouse, venv, torch, deepspeed_env): what
they compute from the fleet's facts once per run, kept in prov.shared (a typed roles.Shared):
each node's wheel platform, the fleet's majority values, the pinned requirements, the
wheelhouse manifests and the ONE torch build for the whole fleet. Paths on the nodes are
paths.py."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nodeprep.errors import InputError, NodeprepError
from nodeprep.ops.provision.roles import UNSET

if TYPE_CHECKING:
    from nodeprep.ops.pystack.wheelhouse import Platform


def platform(facts: dict) -> Platform:
    py = facts.get("python")
    if not py:
        raise NodeprepError("no usable Python interpreter (see the inventory's `python`)")
    from nodeprep.ops.pystack.wheelhouse import (
        Platform,
    )  # packaging.requirements: ~12 ms that verify never needs

    return Platform(
        facts["os"]["arch"], ".".join(py["version"].split(".")[:2]), py["glibc"] or "2.17"
    )


def fleet_majority(prov, what, name: str):
    """The value most nodes have (for parity messages naming both values); WHAT(node, facts).
    Computed once per run under NAME: every node's steps() asks, and a scan of the fleet per
    node is N x N."""
    if name not in prov.shared.majorities:
        from collections import Counter

        values = Counter(what(n, f) for n, f in prov.facts.items() if f.get("python"))
        prov.shared.majorities[name] = values.most_common(1)[0][0] if values else None
    return prov.shared.majorities[name]


def fleet_python(prov) -> str | None:
    """The fleet's Python version."""
    return fleet_majority(prov, lambda n, f: f["python"]["version"], "python")


def torch_plan(prov):
    """The fleet's torch build (None when no node asks for torch); raises PlanError."""
    if prov.shared.torch_plan is UNSET:
        from nodeprep.ops import torchplan

        if not any(v.get("torch_version") for v in prov.vars.values()):
            prov.shared.torch_plan = None
            return None
        nodes = [
            torchplan.node_from_facts(name, f["os"]["arch"], f["gpus"], prov.vars[name]["cpu_only"])
            for name, f in prov.facts.items()
            if "gpus" in f
        ]
        if not nodes:  # no node answered: nothing to plan for (they are reported as such)
            prov.shared.torch_plan = None
            return None
        by_release = _releases_by_platform(prov, nodes)
        template = next(iter(prov.vars.values())).get("torch_index")
        own = template in (None, "pip-config")
        prefer = _module_cuda(prov)
        plans = [
            torchplan.choose(version, group, prefer=prefer)
            if own
            else torchplan.choose(version, group, template, prefer=prefer)
            for version, group in by_release.items()
        ]
        plan = torchplan.merged(plans)
        if own:  # resolve from pip's own configuration (mirror, find-links, PyPI)
            prov.notes += [f"torch plan: {n}" for n in torchplan.from_pip_config(plan)]
        for b in plan.builds:
            prov.notes.append(
                f"torch plan: {b.requirement}"
                + (f" for {b.cpu_arch}" if len(plan.builds) > 1 else "")
                + (f" from {b.index_url}" if b.index_url else " from pip's configured index")
                + (f"; {b.compat}" if b.compat else "")
            )
        prov.shared.torch_plan = plan
    return prov.shared.torch_plan


def _module_cuda(prov) -> str | None:
    """The torch variant the nodes' loaded cuda module names (cuda/12.6 -> cu126: the MODULES
    fact's loaded list), when every node that names modules loads the same one; None else."""
    from nodeprep.ops import torchplan

    got = {
        torchplan.cuda_variant_of_modules((f.get("modules") or {}).get("loaded"))
        for n, f in prov.facts.items()
        if prov.vars[n].get("modules")
    }
    got.discard(None)
    if len(got) > 1:
        prov.notes.append(
            f"torch plan: the nodes load different cuda modules ({', '.join(sorted(got))}): "
            "none is preferred"
        )
    return got.pop() if len(got) == 1 else None


def _releases_by_platform(prov, nodes) -> dict:
    """{torch release: its nodes}. One release per CPU platform: a build for the whole
    platform keeps torch and NCCL identical where ranks talk; platforms may differ (aarch64
    nodes pinned to a release whose PyPI aarch64 wheel is the CPU build)."""
    by_release: dict[str, list] = {}
    per_arch: dict[str, dict[str, str]] = {}
    for n in nodes:
        version = prov.vars[n.name].get("torch_version")
        if version:
            by_release.setdefault(str(version), []).append(n)
            per_arch.setdefault(n.arch, {}).setdefault(str(version), n.name)
    for arch, versions in per_arch.items():
        if len(versions) > 1:  # bad input: named where the last listed node sets it
            raise InputError(
                f"torch_version differs between {arch} nodes ("
                + ", ".join(f"{v} on {n}" for v, n in sorted(versions.items()))
                + "): one build per platform keeps torch and NCCL identical where ranks talk",
                "set one torch_version for every node of that platform",
                *prov.origin(sorted(versions.items())[-1][1], "torch_version"),
            )
    # a node that names no release gets its platform's, or the fleet's one (as before releases
    # could differ per platform)
    for n in nodes:
        if not prov.vars[n.name].get("torch_version"):
            mine = per_arch.get(n.arch) or (
                dict.fromkeys(by_release) if len(by_release) == 1 else {}
            )
            if mine:
                by_release[next(iter(mine))].append(n)
    return by_release


def requirement_pins(prov) -> list[str]:
    """The pinned lines of `python_requirements` (relative paths: beside the inventory, then in
    the nodeprep checkout); InputError with file:line for anything unpinned. Called from the
    roles' validate(), so bad input stops the run before any node is touched."""
    if prov.shared.pins is None:
        from pathlib import Path

        from nodeprep.ops.pystack.wheelhouse import read_requirements

        node, first = next(iter(prov.vars.items()))
        root = prov.settings.project
        base = Path(prov.inventory.path).parent if prov.inventory.path else root
        try:
            paths = [Path(p).expanduser() for p in first["python_requirements"]]
        except RuntimeError:  # `~name/...` of a user this machine does not have
            raise InputError(
                "python_requirements: a `~user/` path of an unknown user",
                "write the path out, or ~/ for your own home",
                *prov.origin(node, "python_requirements"),
            ) from None
        paths = [
            p if p.is_absolute() else (base / p if (base / p).exists() else root / p) for p in paths
        ]
        for given, path in zip(first["python_requirements"], paths):
            if not path.is_file():
                node = next(iter(prov.vars))
                raise InputError(
                    f"python_requirements: {str(given)[:80]!r} is not a file (looked "
                    f"for {str(path)[:120]})",
                    "give requirements files, relative to the inventory or the nodeprep checkout",
                    *prov.origin(node, "python_requirements"),
                )
        prov.shared.pins = read_requirements(paths)
    return prov.shared.pins


def _torch_for(prov, plan, first: dict, arch) -> tuple[list[str], list[str]]:
    """(pins, index args) of one CPU platform: the plan has a build per platform."""
    b = plan.for_arch(arch) if plan else None
    return (
        requirement_pins(prov) + ([b.requirement] if b else []) + list(first["wheel_builds"] or {}),
        ["--extra-index-url", b.index_url] if b and b.index_url else [],
    )


def _built(prov, house, plan, first: dict):
    """The wheels built from the wheel_builds sdists, on the controller (so for its platform);
    None in --check, which builds nothing."""
    import platform as controller

    here = plan.for_arch(controller.machine()) if plan else None  # sdists are built here
    return (
        None
        if prov.check_mode
        else house.build(
            first["wheel_builds"],
            here.requirement if here else None,
            _torch_for(prov, plan, first, controller.machine())[1],
        )
    )


def wheelhouse_manifests(prov) -> list:
    """Once per run: resolve (or, in --check, look up) the wheelhouse of every node platform;
    fills prov.shared.manifests {node: (dir, manifest)} and prov.shared.wheelhouse_errors.
    Shared by the wheelhouse role (push) and the venv role (what to install), so either works
    alone with --roles. Returns the controller step results (once)."""
    if prov.shared.manifests is not None:
        return []
    from nodeprep.engine.results import StepResult
    from nodeprep.errors import NodeprepError
    from nodeprep.ops.pystack.wheelhouse import Wheelhouse

    first = next(iter(prov.vars.values()))
    plan = torch_plan(prov)
    house = Wheelhouse(prov.settings.state / "wheelhouse", log=prov.events.log)
    manifests = prov.shared.manifests = {}
    errors = prov.shared.wheelhouse_errors = {}
    # A node on another Python than the fleet is failed by the venv role (naming both
    # versions); resolving wheels for its platform would only add a second, confusing error.
    fleet_py = fleet_python(prov)
    platforms = {
        n: platform(f)
        for n, f in prov.facts.items()
        if f.get("python") and f["python"]["version"] == fleet_py
    }
    built = _built(prov, house, plan, first)
    results = []
    for p in sorted(set(platforms.values()), key=lambda p: p.key):
        name = f"wheelhouse.download {p.key}"
        pins, index = _torch_for(prov, plan, first, p.arch)
        if prov.check_mode:  # plan from the cache when it matches; never download in --check
            m = house.cached(p, pins, index)
            if m is None:
                results.append(StepResult(name, "changed", "would resolve and download"))
                continue
        else:
            try:
                m = house.resolve(p, pins, index, [built])
            except NodeprepError as e:  # fails this platform's nodes, not the whole fleet
                results.append(StepResult(name, "failed", str(e)))
                errors.update({n: str(e) for n, q in platforms.items() if q == p})
                continue
        fresh = house.downloads.get(p.key, 0) > 0
        results.append(
            StepResult(
                name,
                "changed" if fresh else "ok",
                f"{len(m['files'])} wheels " + ("downloaded" if fresh else "cached"),
            )
        )
        manifests.update({n: (house.root / p.key, m) for n, q in platforms.items() if q == p})
    return results
