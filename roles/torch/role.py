"""torch: ONE torch build for the whole fleet (same torch and bundled NCCL everywhere), chosen
from every node's driver, GPUs and CPU arch (src/nodeprep/ops/torchplan/plan.py), installed by the
wheelhouse and venv roles, and verified on every node after install: torch.__version__,
torch.version.cuda (None on CPU builds), and get_arch_list() covering each GPU (same major,
equal or higher minor; PTX for newer)."""

from __future__ import annotations

import inspect
import json
import posixpath
import re
import shlex

from packaging.version import InvalidVersion, Version

from nodeprep.engine.facts import GPUS, MODULES, OS, STAMP, USER, VENV
from nodeprep.engine.facts.modules import with_modules
from nodeprep.engine.remote import rpath, stamp_from_list
from nodeprep.engine.results import StepResult
from nodeprep.engine.steps import Step, StepCheck, scope_of
from nodeprep.errors import InputError
from nodeprep.ops import pystack

FACTS = [GPUS, OS, USER]


def covered(cap: str, arch_list: list) -> bool:
    """A GPU of capability CAP ("9.0") runs a build compiled for ARCH_LIST: an sm_ of the same
    major and an equal or lower minor, or PTX (compute_) for an older one."""
    major, minor = (int(x) for x in cap.split("."))
    sms = [a for a in arch_list if a.startswith("sm_")]
    ok = any(int(a[3:-1]) == major and int(a[-1]) <= minor for a in sms)
    ptx = [int(a[8:]) for a in arch_list if a.startswith("compute_")]
    return ok or any(p <= major * 10 + minor for p in ptx)


# Run by the venv's python on the node: import torch (and what it imports: numpy when present),
# check it against the plan, then list what the stamp records (engine/remote.stamp_from_list):
# line 1 what was verified, then every file whose change could break the import (each
# package's RECORD, every compiled extension and shared library, each top-level package's
# __init__.py, the .pth files), relative to the venv. The next run's check compares the stamp,
# not pip's metadata alone: a torch that fails to import is never "ok" again.
VERIFY = (
    r"""
import json, os, platform, sys
import torch
import importlib.util
if importlib.util.find_spec("numpy") is not None:
    import numpy        # torch's ops on arrays load it; a broken numpy fails here, not in a job
want = json.loads(sys.argv[1])
got = {"version": torch.__version__, "cuda": torch.version.cuda,
       "arch_list": torch.cuda.get_arch_list() if torch.version.cuda else []}
print(json.dumps(got))
bad = []
# a plain version pin matches any local build of it (PEP 440): PyPI's aarch64 torch==2.8.0
# reports 2.8.0+cpu
if got["version"] != want["version"] and ("+" in want["version"] or got["version"].split("+")[0] != want["version"]):
    bad.append("torch %s installed, want %s" % (got["version"], want["version"]))
if (got["cuda"] or None) != want["cuda"]:
    bad.append("torch.version.cuda is %s, want %s" % (got["cuda"], want["cuda"]))
"""  # noqa: E501 (VERIFY's program text is left as it was)
    + inspect.getsource(covered)
    + r"""
for cap in want["capabilities"]:
    if not covered(cap, got["arch_list"]):
        bad.append("GPU capability %s not in torch.cuda.get_arch_list() %s" % (cap, got["arch_list"]))
if bad:
    sys.exit("; ".join(bad))
site = os.path.dirname(os.path.dirname(torch.__file__))
names = set()
for e in os.scandir(site):
    if e.name.endswith(".dist-info"):
        names.add(os.path.join(e.path, "RECORD"))
    elif e.name.endswith(".pth") or e.name.endswith(".so"):
        names.add(e.path)
    elif e.is_dir():
        names.add(os.path.join(e.path, "__init__.py"))
for root, dirs, files in os.walk(site):
    names.update(os.path.join(root, f) for f in files if f.endswith(".so") or ".so." in f)
keep = sorted(os.path.relpath(n, sys.prefix) for n in names if os.path.isfile(n) and "\n" not in n)
with open(sys.argv[2], "w") as out:
    out.write(json.dumps(dict(got, machine=platform.machine())) + "\n" + "".join(n + "\n" for n in keep))
"""  # noqa: E501 (VERIFY's program text is left as it was)
)

STAMP_NAME = pystack.paths.VERIFIED  # in the venv: its listing is STAMP_NAME.list while made


_INDEX = re.compile(r"(https?|file)://[A-Za-z0-9_.~:/?#\[\]@!&'()*+,;=%{}-]+")


def validate(prov):
    """torch_version a release number, torch_index a URL (or pip-config): both reach pip's
    argv and the node's requirements.lock."""
    for node, v in prov.vars.items():
        version, index = v.get("torch_version"), v.get("torch_index")
        if version is not None:
            try:
                Version(str(version))
            except InvalidVersion:
                raise InputError(
                    f"torch_version: {str(version)[:40]!r} is not a version number",
                    'e.g. "2.13.0" (quoted)',
                    *prov.origin(node, "torch_version"),
                ) from None
        if index and index != "pip-config" and not _INDEX.fullmatch(str(index)):
            raise InputError(
                f"torch_index: {str(index)[:60]!r} is not an http(s):// or file:// URL",
                "e.g. https://download.pytorch.org/whl/{variant}, or pip-config",
                *prov.origin(node, "torch_index"),
            )


def controller(prov):
    plan = pystack.torch_plan(prov)  # raises PlanError (names the blocking node) before any change
    return (
        [
            StepResult(
                f"torch.plan {b.requirement}"
                + (f" ({b.cpu_arch})" if len(plan.builds) > 1 else ""),
                "ok",
                f"variant {b.variant}" + (f"; {b.compat}" if b.compat else ""),
            )
            for b in plan.builds
        ]
        if plan
        else []
    )


def reads(ctx):
    venv = ctx.vars["venv_path"]
    # MODULES: a loaded cuda module is the torch plan's preferred variant (pystack.torch_plan)
    return [VENV(venv), STAMP(pystack.verified_stamp(venv))] + (
        [MODULES] if ctx.vars.get("modules") else []
    )


def matches(have: str | None, want: str) -> bool:
    """HAVE (installed) is the pinned WANT; a pin without a local tag matches any local build
    of that version, as pip's `==` does (PyPI's aarch64 torch==2.8.0 says 2.8.0+cpu)."""
    return have == want or bool(have) and "+" not in want and have.split("+")[0] == want


def verified(stamp: dict, want: dict, arch: str) -> StepCheck:
    """The stamp of the last import that passed (VERIFY's) against what this node needs: made
    on this CPU, for the planned torch, covering this node's GPUs, every file as it was then."""
    if not stamp or not stamp["exists"]:
        return StepCheck(False, "torch never imported here (no stamp of a passed verify)")
    try:
        got = json.loads(stamp["head"])
        machine = got["machine"]
        version = got["version"]
        cuda = got["cuda"]
        arch_list = got["arch_list"]
    except (ValueError, TypeError, KeyError):
        return StepCheck(False, "the stamp of the last verify is unreadable")
    if machine != arch:
        return StepCheck(False, f"verified on {machine}, this node is {arch}")
    if not stamp["same"]:
        ch = stamp["changed"]
        return StepCheck(
            False,
            f"{len(ch)} file(s) changed since torch last imported here "
            f"({', '.join(posixpath.basename(c) for c in ch[:3])}{', ...' if len(ch) > 3 else ''})",
        )
    if not matches(version, want["version"]) or (cuda or None) != want["cuda"]:
        return StepCheck(
            False,
            f"verified torch {version} (CUDA {cuda}), want {want['version']} (CUDA {want['cuda']})",
        )
    lack = [c for c in want["capabilities"] if not covered(c, arch_list)]
    return StepCheck(
        not lack, f"GPU capability {', '.join(lack)} not in the verified build's arch list"
    )


def steps(ctx):
    plan = pystack.torch_plan(ctx.prov)
    if not plan:
        return []
    plan = plan.for_arch(ctx.facts[OS]["arch"])  # this node's platform's build
    version = plan.requirement.split("==", 1)[1]
    caps = sorted({d["capability"] for d in ctx.facts[GPUS]["devices"] if d.get("capability")})
    want = {"version": version, "cuda": plan.cuda, "capabilities": caps}
    venv, arch = ctx.vars["venv_path"], ctx.facts[OS]["arch"]
    key, stamp = VENV(venv), STAMP(pystack.verified_stamp(venv))

    def check(facts):
        have = facts[key]["packages"].get("torch")
        if not matches(have, version):
            return StepCheck(False, f"torch {have or 'missing'}, want {version}")
        return verified(facts[stamp], want, arch)

    v = rpath(venv)
    listing = STAMP_NAME + ".list"
    # the old stamp goes first: a verify that fails leaves none behind; with the node's
    # modules loaded (the venv's python may need them)
    action = with_modules(
        ctx.vars,
        f"rm -f {v}/{STAMP_NAME} && "
        f"{v}/bin/python -c {shlex.quote(VERIFY)} {shlex.quote(json.dumps(want))} "
        f"{v}/{listing} && " + stamp_from_list(venv, STAMP_NAME, listing),
    )
    return [
        Step(
            f"torch.verify {plan.requirement}",
            [key, stamp],
            check,
            action=action,
            hint="the installed torch does not match the plan or does not import; "
            "see the step output",
            scope=scope_of(venv),
        )
    ]
