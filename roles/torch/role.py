"""torch: ONE torch build for the whole fleet (same torch and bundled NCCL everywhere), chosen
from every node's driver, GPUs and CPU arch (src/nodeprep/ops/torchplan/plan.py), installed by the
wheelhouse and venv roles, and verified on every node after install: torch.__version__,
torch.version.cuda (None on CPU builds), and get_arch_list() covering each GPU (same major,
equal or higher minor; PTX for newer)."""
from __future__ import annotations

import json
import re
import shlex

from packaging.version import InvalidVersion, Version

from nodeprep.errors import InputError
from nodeprep.ops import pystack
from nodeprep.engine.remote import rpath
from nodeprep.engine.results import StepResult
from nodeprep.engine.facts import GPUS, OS, USER, VENV
from nodeprep.engine.steps import Check, Step, scope_of

FACTS = [GPUS, OS, USER]

VERIFY = r'''
import json, sys
import torch
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
def covered(cap):
    major, minor = (int(x) for x in cap.split("."))
    sms = [a for a in got["arch_list"] if a.startswith("sm_")]
    ok = any(int(a[3:-1]) == major and int(a[-1]) <= minor for a in sms)
    ptx = [int(a[8:]) for a in got["arch_list"] if a.startswith("compute_")]
    return ok or any(p <= major * 10 + minor for p in ptx)
for cap in want["capabilities"]:
    if not covered(cap):
        bad.append("GPU capability %s not in torch.cuda.get_arch_list() %s" % (cap, got["arch_list"]))
if bad:
    sys.exit("; ".join(bad))
'''


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
                raise InputError(f"torch_version: {str(version)[:40]!r} is not a version number",
                                 "e.g. \"2.13.0\" (quoted)", *prov.origin(node, "torch_version")) from None
        if index and index != "pip-config" and not _INDEX.fullmatch(str(index)):
            raise InputError(f"torch_index: {str(index)[:60]!r} is not an http(s):// or file:// URL",
                             "e.g. https://download.pytorch.org/whl/{variant}, or pip-config",
                             *prov.origin(node, "torch_index"))


def controller(prov):
    plan = pystack.torch_plan(prov)    # raises PlanError (names the blocking node) before any change
    return [StepResult(f"torch.plan {b.requirement}" + (f" ({b.cpu_arch})" if len(plan.builds) > 1 else ""),
                       "ok", f"variant {b.variant}" + (f"; {b.compat}" if b.compat else ""))
            for b in plan.builds] if plan else []


def reads(ctx):
    return [VENV(ctx.vars["venv_path"])]


def matches(have: str | None, want: str) -> bool:
    """HAVE (installed) is the pinned WANT; a pin without a local tag matches any local build
    of that version, as pip's `==` does (PyPI's aarch64 torch==2.8.0 says 2.8.0+cpu)."""
    return have == want or bool(have) and "+" not in want and have.split("+")[0] == want


def steps(ctx):
    plan = pystack.torch_plan(ctx.prov)
    if not plan:
        return []
    plan = plan.for_arch(ctx.facts[OS]["arch"])     # this node's platform's build
    version = plan.requirement.split("==", 1)[1]
    caps = sorted({d["capability"] for d in ctx.facts[GPUS]["devices"] if d.get("capability")})
    want = {"version": version, "cuda": plan.cuda, "capabilities": caps}
    key = VENV(ctx.vars['venv_path'])

    def check(facts):
        have = facts[key]["packages"].get("torch")
        return Check(matches(have, version), f"torch {have or 'missing'}, want {version}")

    py = f"{rpath(ctx.vars['venv_path'])}/bin/python"
    action = f"{py} -c {shlex.quote(VERIFY)} {shlex.quote(json.dumps(want))}"
    return [Step(f"torch.verify {plan.requirement}", [VENV(ctx.vars["venv_path"])], check, action,
                 hint="the installed torch does not match the plan; see the step output",
                 scope=scope_of(ctx.vars["venv_path"]))]
