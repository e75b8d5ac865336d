"""What verify-parity compares on each node: the facts its probe asks for, and the node's
fingerprint (flat comparable keys, what parity.py groups). The checks on them are checks.py.

NCCL keys (nccl.* are GPU keys; absent, never None, where torch is a CPU build or NCCL never
ran, e.g. gloo):
  torch.nccl          the NCCL torch was BUILT with (torch.cuda.nccl.version())
  nccl.lib.path       the libnccl torch really maps after `import torch` (its real path; every
                      one mapped, comma-joined; "static (in libtorch_cuda.so)" when NCCL is
                      linked into torch)
  nccl.lib.version    that library's own ncclGetVersion()
  nccl.run.net_plugin the net plugin NCCL loaded in --collective's ranks, from NCCL's own log
                      ("aws-ofi-nccl 1.16.2", "none", "... (initialization failed)")
  nccl.run.network    the network NCCL used there ("IB", "Socket", "Libfabric", "IBext", ...)
  nccl.run.transport  the transports of its channels ("NET/IB/GDRDMA, P2P/CUMEM", ...)"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from nodeprep.engine.facts import (
    DIR,
    FILE,
    GPUS,
    IDENTITY,
    INTERFACES,
    LOGIN_SHELL,
    OS,
    PORT_LISTENING,
    PYTHON_ON_PATH,
    ROUTE,
    TORCH_BUILD,
    USER,
    VENV,
    TorchIn,
)
from nodeprep.engine.facts.container import CONTAINER
from nodeprep.engine.facts.modules import MODULES
from nodeprep.engine.facts.python import IMAGE_STACK
from nodeprep.ops import pystack, torchplan
from nodeprep.ops.container import readiness
from nodeprep.ops.ssh import paper_mesh
from nodeprep.redact import is_secret

SEVERITY = {
    "os.kernel": "warning",
    "os.release": "warning",
    "gpu.driver": "warning",
    "net.interfaces": "info",
    "nccl.run.transport": "warning",
}
GPU_KEYS = ("gpu.", "torch.cuda_available", "torch.covers_gpus", "nccl.")
RUN_KEYS = "nccl.run."  # from --collective's NCCL log, not from the probe
DEEPSPEED_ENV = "~/.deepspeed_env"


@dataclass(frozen=True)
class Expect:
    """What one node is checked against: the job directory that must exist, the master port
    that must be free (the head node only), and the head's address (NCCL must reach it)."""

    workdir: str | None = None
    port: int | None = None
    head: str | None = None
    image: object = None  # the container way: the ArchiveImage every node must hold


def requests(v: dict, deep: bool, want: Expect) -> list:
    """The fact requests of one node's probe."""
    workdir, port = want.workdir, want.port
    reqs = [
        OS,
        LOGIN_SHELL,
        USER,
        PYTHON_ON_PATH,
        INTERFACES,
        GPUS,
        IDENTITY,
        VENV(v["venv_path"]),
        TORCH_BUILD(TorchIn(v["venv_path"], deep)),
        FILE(DEEPSPEED_ENV),
        FILE(v["env_file"]),
    ]
    if want.head:
        reqs.append(ROUTE(want.head))
    if v.get("ssh_mesh"):
        reqs += [FILE(p) for p in paper_mesh.FILES]
    if workdir:
        reqs.append(DIR(workdir))
    if port:
        reqs.append(PORT_LISTENING(port))
    if v.get("modules"):
        reqs.append(MODULES)
    if want.image is not None:
        reqs += [
            CONTAINER(readiness.engines(v.get("container_engine"))),
            IMAGE_STACK(want.image.id),
        ]
    return reqs


def with_container(fp: dict, v: dict, f, image) -> dict:
    """FP plus the container way's keys (IMAGE: the ArchiveImage wanted, None: the venv way):
    container.engine  the engine the node would use and its version ("podman 4.3.1"), or
                      what keeps it from one (its code, e.g. CONTAINER_NO_ENGINE)
    container.image   the wanted image's ID when the node holds it; else the ID(s) the node
                      holds under the image's name, or "missing": DRIFT names the IDs
    container.python, container.pkg.NAME, container.torch.{version,cuda,nccl}   the Python
                      stack INSIDE the image (IMAGE_STACK: its python3 run by the engine), the
                      venv's keys' counterparts"""
    if image is None:
        return fp
    fact = f.get(CONTAINER(readiness.engines(v.get("container_engine"))))
    u = f.get(USER)
    ready = readiness.assess(
        fact, v.get("container_engine") or "auto", 0, (u or {}).get("name", "")
    )
    fp["container.engine"] = (
        f"{ready.engine} {ready.version}"
        if ready.engine and not ready.problems
        else (ready.problems[0].code if ready.problems else "unknown")
    )
    held = ((fact or {}).get("engines") or {}).get(ready.engine, {}).get("images") or []
    if any(i["id"] == image.id for i in held):
        fp["container.image"] = image.id
    else:
        names = set(image.tags)
        other = sorted({i["id"] for i in held if i["name"] in names})
        fp["container.image"] = ", ".join(other) if other else "missing"
    stack = f.get(IMAGE_STACK(image.id))
    if stack:
        fp["container.python"] = stack.get("python") or stack.get("error")
        for name, version in sorted((stack.get("packages") or {}).items()):
            fp[f"container.pkg.{name}"] = version
        t = stack.get("torch") or {}
        for k in ("version", "cuda", "nccl"):
            fp[f"container.torch.{k}"] = t.get(k)
        if t.get("error"):
            fp["container.torch.version"] = f"error: {t['error']}"
    return fp


def _env_lines(text: str | None, export: bool) -> dict[str, str]:
    out = {}
    for line in (text or "").splitlines():
        line = line.strip()
        if export:
            if not line.startswith("export "):
                continue
            line = line[len("export ") :]
        if "=" in line and not line.startswith("#"):
            k, _, v = line.partition("=")
            out[k.strip()] = v
    return out


def _hide(k: str, v):
    if v is not None and is_secret(k):
        return "sha256:" + hashlib.sha256(str(v).encode()).hexdigest()[:12]
    return v


def _covered(archs: list[str], cap: str) -> bool:
    sms = [f"{a[3:-1]}.{a[-1]}" for a in archs if a.startswith("sm_")]
    ptx = any(a.startswith("compute_") for a in archs)
    return torchplan.covers(sms, ptx, cap)


def _python_and_torch(fp: dict, v: dict, f) -> None:
    venv = f.get(VENV(v["venv_path"])) or {}
    here = pystack.venv_path(v, f) if f.get(USER) else None
    fp["python.path"] = f"{here}/bin/python" if venv.get("exists") else None
    fp["python.version"] = venv.get("python")
    for name, version in (venv.get("packages") or {}).items():
        fp[f"pkg.{name}"] = version
    t = f.get(TORCH_BUILD(TorchIn(v["venv_path"])))
    g = f.get(GPUS) or {}
    caps = sorted({d["capability"] for d in g.get("devices", []) if d.get("capability")})
    if t:
        fp["torch.version"], fp["torch.cuda"] = t.get("version"), t.get("cuda")
        fp["torch.nccl"], fp["torch.cuda_available"] = t.get("nccl"), t.get("available")
        archs = [a for a in t.get("arch_list", [])]
        fp["torch.covers_gpus"] = all(_covered(archs, c) for c in caps) if caps else None
        _nccl_lib(fp, t.get("nccl_lib"))


def _nccl_lib(fp: dict, lib: dict | None) -> None:
    """The libnccl torch maps, as the probe found it (ncclrt.describe); CPU builds have none."""
    if not lib:
        return
    if lib.get("error"):
        fp["nccl.lib.path"] = f"error: {lib['error']}"
        return
    libs = [lib, *lib.get("also", [])]
    fp["nccl.lib.path"] = ", ".join(str(x.get("path")) for x in libs)
    if any(x.get("version") for x in libs):
        fp["nccl.lib.version"] = ", ".join(x.get("version") or "?" for x in libs)


def with_run(fp: dict, logged: dict | None) -> dict:
    """FP plus what NCCL's log said on this node in --collective (nccllog.parse): only the
    values it said, so gloo runs add nothing."""
    for k in ("net_plugin", "network", "transport"):
        if (logged or {}).get(k):
            fp[RUN_KEYS + k] = logged[k]
    return fp


def _modules(fp: dict, v: dict, f) -> None:
    """With `modules` named: modules.system ("lmod 8.6.19", or "none"), modules.loaded (what
    `module -t list` shows after the loads, versions included) and modules.env.NAME for every
    variable the modules set (PATH, LD_LIBRARY_PATH, CUDA_HOME, ...): a node whose cuda/12.6
    resolves to another prefix is DRIFT on modules.env.CUDA_HOME with both values."""
    if not v.get("modules"):
        return
    m = f.get(MODULES) or {}
    fp["modules.system"] = (
        f"{m['system']} {m.get('version', '')}".strip() if m.get("system") else "none"
    )
    fp["modules.loaded"] = ", ".join(m.get("loaded") or []) or "none"
    for k, val in (m.get("env") or {}).items():
        fp[f"modules.env.{k}"] = _hide(k, val)


def fingerprint(v: dict, f, path_seen: str | None, workdir: str | None) -> dict:
    """The node's facts as flat comparable keys."""
    fp: dict = {}
    _python_and_torch(fp, v, f)
    _modules(fp, v, f)
    g = f.get(GPUS) or {}
    fp["cpu.arch"] = f[OS]["arch"]
    fp["os.release"], fp["os.kernel"] = f[OS]["release"], f[OS]["kernel"]
    fp["gpu.count"], fp["gpu.driver"] = g.get("count", 0), g.get("driver")
    fp["gpu.models"] = ", ".join(sorted({d["name"] for d in g.get("devices", [])})) or None
    fp["shell.login"] = f.get(LOGIN_SHELL)
    fp["shell.noninteractive_python"] = path_seen
    ds = f.get(FILE(DEEPSPEED_ENV)) or {}
    fp["env.deepspeed_env"] = "present" if ds.get("exists") else None
    for k, val in _env_lines(ds.get("content"), export=False).items():
        fp[f"env.deepspeed.{k}"] = _hide(k, val)
    for k, val in _env_lines(
        (f.get(FILE(v["env_file"])) or {}).get("content"), export=True
    ).items():
        fp[f"env.shell.{k}"] = _hide(k, val)
    fp["net.interfaces"] = ",".join(sorted(n for n in (f.get(INTERFACES) or {}) if n != "lo"))
    if workdir:
        fp["job.workdir_exists"] = f.get(DIR(workdir)) is not None
    return fp


def for_baseline(now: dict, old: dict, ran: bool) -> tuple[dict, dict]:
    """nccl.run.* exist only where --collective ran: compared with a baseline node only when
    it ran now and the baseline has them for that node (copies; NOW and OLD stay as given)."""
    strip = lambda fp: {k: val for k, val in fp.items() if not k.startswith(RUN_KEYS)}
    now, old = dict(now), dict(old)
    for n, fp in old.items():
        if not ran or not any(k.startswith(RUN_KEYS) for k in fp):
            old[n] = strip(fp)
            if n in now:
                now[n] = strip(now[n])
    return now, old
