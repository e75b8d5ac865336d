"""What verify-parity compares and checks on each node: the facts it asks for, the node's
fingerprint (flat comparable keys), the per-node checks that catch hangs before a launch,
and the fleet comparison (GPU keys among GPU nodes only)."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from nodeprep.engine.facts import (DIR, FILE, GPUS, IDENTITY, INTERFACES, ROUTE, LOGIN_SHELL, OS, PORT_LISTENING,
                                   PYTHON_ON_PATH, TORCH_BUILD, USER, VENV, TorchIn, reaching)
from nodeprep.ops import meshcheck, parity, pystack, torchplan
from nodeprep.redact import is_secret

SEVERITY = {"os.kernel": "warning", "os.release": "warning", "gpu.driver": "warning",
            "net.interfaces": "info"}
GPU_KEYS = ("gpu.", "torch.cuda_available", "torch.covers_gpus")
DEEPSPEED_ENV = "~/.deepspeed_env"


@dataclass(frozen=True)
class Expect:
    """What one node is checked against: the job directory that must exist, the master port
    that must be free (the head node only), and the head's address (NCCL must reach it)."""
    workdir: str | None = None
    port: int | None = None
    head: str | None = None


def requests(v: dict, deep: bool, want: Expect) -> list:
    """The fact requests of one node's probe."""
    workdir, port = want.workdir, want.port
    reqs = [OS, LOGIN_SHELL, USER, PYTHON_ON_PATH, INTERFACES, GPUS, IDENTITY, VENV(v["venv_path"]),
            TORCH_BUILD(TorchIn(v["venv_path"], deep)), FILE(DEEPSPEED_ENV), FILE(v["env_file"])]
    if want.head:
        reqs.append(ROUTE(want.head))
    if v.get("ssh_mesh"):
        reqs += [FILE(p) for p in meshcheck.FILES]
    if workdir:
        reqs.append(DIR(workdir))
    if port:
        reqs.append(PORT_LISTENING(port))
    return reqs


def _env_lines(text: str | None, export: bool) -> dict[str, str]:
    out = {}
    for line in (text or "").splitlines():
        line = line.strip()
        if export:
            if not line.startswith("export "):
                continue
            line = line[len("export "):]
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


def fingerprint(v: dict, f, path_seen: str | None, workdir: str | None) -> dict:
    """The node's facts as flat comparable keys."""
    fp: dict = {}
    _python_and_torch(fp, v, f)
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
    for k, val in _env_lines((f.get(FILE(v["env_file"])) or {}).get("content"), export=True).items():
        fp[f"env.shell.{k}"] = _hide(k, val)
    fp["net.interfaces"] = ",".join(sorted(n for n in (f.get(INTERFACES) or {}) if n != "lo"))
    if workdir:
        fp["job.workdir_exists"] = f.get(DIR(workdir)) is not None
    return fp


def ifname_selects(spec: str, names: list[str]) -> set[str]:
    """The interfaces NCCL_SOCKET_IFNAME selects (grammar: `^a,b` excludes, `=a,b` exact,
    else prefixes; lo only when named)."""
    names = [n for n in names if n != "lo"] if not spec.lstrip("^=").startswith("lo") else names
    if spec.startswith("^"):
        bad = [p for p in spec[1:].split(",") if p]
        return {n for n in names if not any(n.startswith(b.lstrip("=")) for b in bad)}
    if spec.startswith("="):
        return {n for n in names if n in spec[1:].split(",")}
    return {n for n in names if any(n.startswith(p) for p in spec.split(",") if p)}


def ifname_matches(spec: str, names: list[str]) -> bool:
    return bool(ifname_selects(spec, names))


def _socket_ifname(bad, fp: dict, f, want: Expect) -> None:
    """The configured NCCL_SOCKET_IFNAME must select an existing interface, the one this
    node reaches the head through."""
    ifs = f.get(INTERFACES) or {}
    spec = fp.get("env.deepspeed.NCCL_SOCKET_IFNAME") or fp.get("env.shell.NCCL_SOCKET_IFNAME")
    if not spec:
        return
    chosen = ifname_selects(spec.strip("'\""), list(ifs))
    via = reaching(ifs, f.get(ROUTE(want.head))) if want.head else None
    if not chosen:
        bad("net.NCCL_SOCKET_IFNAME", f"NCCL_SOCKET_IFNAME={spec} matches no interface here "
            f"({', '.join(ifs)})")
    elif via and via not in chosen:
        bad("net.NCCL_SOCKET_IFNAME", f"NCCL_SOCKET_IFNAME={spec} selects {', '.join(sorted(chosen))} "
            f"here, but the head ({want.head}) is reached through {via}")
    elif via and len(chosen) > 1:
        bad("net.NCCL_SOCKET_IFNAME", f"NCCL_SOCKET_IFNAME={spec} selects {', '.join(sorted(chosen))} "
            f"here; the head ({want.head}) is reached through {via} alone", "warning")


def checks_for(host, v: dict, f, fp: dict, want: Expect) -> list[dict]:
    """Problems on one node that make launches fail or hang."""
    out, workdir, port = [], want.workdir, want.port

    def bad(key, msg, severity="error"):
        out.append({"node": host.name, "key": key, "message": msg, "severity": severity})
    g = f.get(GPUS) or {}
    if g.get("error"):
        bad("gpu", f"nvidia-smi: {g['error'][:120]}")
    if g.get("count") and host.slots and g["count"] != host.slots:
        bad("gpu.count", f"{g['count']} GPUs but the inventory gives it {host.slots} slots")
    if fp.get("torch.covers_gpus") is False:
        bad("torch.covers_gpus", "torch.cuda.get_arch_list() lacks this node's GPU capability")
    if g.get("count") and fp.get("torch.cuda_available") is False:
        bad("torch.cuda_available", "torch.cuda.is_available() is False on a GPU node")
    if fp.get("python.path") is None:
        bad("python.path", f"no venv at {v['venv_path']} (run `invoke provision`)")
    elif fp.get("shell.noninteractive_python") != fp["python.path"]:
        bad("shell.noninteractive_python", f"a non-interactive ssh shell finds "
            f"{fp.get('shell.noninteractive_python') or 'no python'}, not {fp['python.path']}")
    _socket_ifname(bad, fp, f, want)
    if workdir and fp.get("job.workdir_exists") is False:
        bad("job.workdir", f"{workdir} does not exist (the launchers cd into it on every node)")
    if port and f.get(PORT_LISTENING(port)):
        bad("net.master_port", f"port {port} is already in use on the head node")
    return out


def mesh_checks(a, inventory_hosts, tried: dict, v_of: dict, paper: dict, pinned: dict) -> list[dict]:
    """One ssh.mesh error per failing pair A -> B: the real login's result where A tried one
    (TRIED: {peer: (rc, error)}; it is the stronger proof), else the on-paper reasons (when
    nodeprep manages the mesh). PAPER: {node: meshcheck.NodeFiles}; PINNED: {node: the
    controller's pinned key blobs}."""
    out = []
    for b in inventory_hosts:
        if b.name in tried:
            rc, err = tried[b.name]
            why = [f"login failed (exit {rc})" + (f": {err}" if err else "")] if rc else []
        elif v_of[a.name].get("ssh_mesh") and a.name in paper and b.name in paper:
            why = meshcheck.problems(a.name, b, paper[a.name], paper[b.name], pinned[b.name])
        else:
            why = []
        if why:
            out.append({"node": a.name, "key": "ssh.mesh", "severity": "error",
                        "message": f"{a.name} -> {b.name}: " + "; ".join(why)})
    return out


def compare_fleet(fps: dict, cpu_only: set, checks, unreachable, order):
    """GPU keys are compared among the GPU nodes only: a node the inventory marks cpu_only is
    meant to differ there."""
    is_gpu = lambda k: k.startswith(GPU_KEYS)
    rest = {n: {k: v for k, v in fp.items() if not is_gpu(k)} for n, fp in fps.items()}
    report = parity.compare(rest, SEVERITY, checks, unreachable, order=order)
    gpu = {n: {k: v for k, v in fp.items() if is_gpu(k)} for n, fp in fps.items() if n not in cpu_only}
    if gpu:
        g = parity.compare(gpu, SEVERITY, (), None, order=[n for n in order if n in gpu])
        report.drift = sorted(report.drift + g.drift,
                              key=lambda d: (parity.SEVERITIES.index(d.severity), d.key))
        report.compared_keys += g.compared_keys
        report.ok = report.ok and g.ok
    return report
