"""The checks verify-parity makes on each node's fingerprint (fingerprints.py) and facts:
problems that make launches fail or hang (GPUs, torch, the non-interactive python, the NCCL
interface and library, the job directory, the master port), the ssh mesh per pair, NCCL's
log against the probe, and the fleet comparison (GPU keys among GPU nodes only)."""

from __future__ import annotations

from nodeprep.engine.facts import (
    GPUS,
    INTERFACES,
    PORT_LISTENING,
    ROUTE,
    TORCH_BUILD,
    TorchIn,
    reaching,
)
from nodeprep.ops.ssh import paper_mesh
from nodeprep.ops.verify import parity
from nodeprep.ops.verify.fingerprints import GPU_KEYS, SEVERITY, Expect


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
        bad(
            "net.NCCL_SOCKET_IFNAME",
            f"NCCL_SOCKET_IFNAME={spec} matches no interface here ({', '.join(ifs)})",
        )
    elif via and via not in chosen:
        bad(
            "net.NCCL_SOCKET_IFNAME",
            f"NCCL_SOCKET_IFNAME={spec} selects {', '.join(sorted(chosen))} "
            f"here, but the head ({want.head}) is reached through {via}",
        )
    elif via and len(chosen) > 1:
        bad(
            "net.NCCL_SOCKET_IFNAME",
            f"NCCL_SOCKET_IFNAME={spec} selects {', '.join(sorted(chosen))} "
            f"here; the head ({want.head}) is reached through {via} alone",
            "warning",
        )


def _release(text) -> tuple[int, ...] | None:
    try:
        return tuple(int(x) for x in str(text).split("+")[0].split("."))
    except ValueError:
        return None


def _nccl_checks(bad, fp: dict, lib: dict | None) -> None:
    """The libnccl torch maps against the one it was built with. NCCL keeps its ABI within a
    major version, so a NEWER runtime is how the aws-ofi-nccl recipes run (a system NCCL
    newer than torch's): a warning. An OLDER one may lack functions torch's build calls
    (torch enables them by the NCCL it was compiled with), another major is another ABI:
    errors."""
    if not lib:
        return
    if lib.get("error"):
        bad("nccl.lib", f"could not tell which libnccl torch maps: {lib['error'][:160]}", "warning")
        return
    if lib.get("also"):
        bad(
            "nccl.lib",
            f"{len(lib['also']) + 1} libnccl mapped in one process ({fp['nccl.lib.path']}): "
            "which one torch calls depends on load order (LD_PRELOAD? LD_LIBRARY_PATH?)",
        )
    if lib.get("version_error"):
        bad(
            "nccl.lib.version",
            f"{lib['path']} does not tell its version: {lib['version_error'][:120]}",
            "warning",
        )
    built, runs = _release(fp.get("torch.nccl")), _release(lib.get("version"))
    if built and runs and built != runs:
        older = runs < built or runs[0] != built[0]
        why = (
            ": older than its build, or another major version"
            if older
            else ": newer (an upgraded nvidia-nccl wheel, "
            "or LD_LIBRARY_PATH or LD_PRELOAD putting another first)"
        )
        bad(
            "nccl.lib.version",
            f"torch was built with NCCL {fp['torch.nccl']} but loads {lib['version']} "
            f"({lib['path']})" + why,
            "error" if older else "warning",
        )
    for var in ("LD_LIBRARY_PATH", "LD_PRELOAD"):
        if fp.get(f"env.deepspeed.{var}") is not None:
            bad(
                f"env.deepspeed.{var}",
                f"~/.deepspeed_env sets {var}: DeepSpeed's ranks get it, the probe "
                "(and torchrun's ranks) do not, so their libnccl may not be the one above",
                "warning",
            )


def run_checks(fps: dict, logged: dict) -> list[dict]:
    """--collective: the NCCL version rank 0 announced against the libnccl the probe found
    on its node; different ones mean the ranks do not load what the probe sees."""
    out = []
    for node, got in logged.items():
        ran, probed = got.get("version"), fps.get(node, {}).get("nccl.lib.version")
        if ran and probed and ran != probed and "," not in probed:
            out.append(
                {
                    "node": node,
                    "key": "nccl.lib.version",
                    "severity": "error",
                    "message": f"the collective's ranks ran NCCL {ran}, the probe found {probed} "
                    f"({fps[node].get('nccl.lib.path')}): the ranks load another libnccl",
                }
            )
    return out


def checks_for(host, v: dict, f, fp: dict, want: Expect) -> list[dict]:
    """Problems on one node that make launches fail or hang."""
    out = []
    workdir = want.workdir
    port = want.port

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
    if want.image is not None:  # the container way: the image's Python, not a venv
        _container_checks(bad, fp, want.image.id)
    elif fp.get("python.path") is None:
        bad("python.path", f"no venv at {v['venv_path']} (run `invoke provision`)")
    elif fp.get("shell.noninteractive_python") != fp["python.path"]:
        bad(
            "shell.noninteractive_python",
            f"a non-interactive ssh shell finds "
            f"{fp.get('shell.noninteractive_python') or 'no python'}, not {fp['python.path']}",
        )
    _socket_ifname(bad, fp, f, want)
    _nccl_checks(bad, fp, (f.get(TORCH_BUILD(TorchIn(v["venv_path"]))) or {}).get("nccl_lib"))
    if workdir and fp.get("job.workdir_exists") is False:
        bad("job.workdir", f"{workdir} does not exist (the launchers cd into it on every node)")
    if port and f.get(PORT_LISTENING(port)):
        bad("net.master_port", f"port {port} is already in use on the head node")
    return out


def _container_checks(bad, fp: dict, want: str) -> None:
    """The engine usable and the image held by its ID (fingerprints.with_container's keys)."""
    engine = fp.get("container.engine") or "unknown"
    if engine.startswith("CONTAINER_") or engine == "unknown":
        bad(
            "container.engine",
            f"{engine}: no usable container engine (`invoke provision "
            "--roles container` names the fix)",
        )
    if fp.get("container.image") == want and not fp.get("container.python"):
        bad(
            "container.python",
            "UNKNOWN: the image's python3 could not be probed (try `ENGINE run --rm IMAGE "
            "python3 -V` on the node)",
        )
    if str(fp.get("container.torch.version") or "").startswith("error"):
        bad("container.torch", f"import torch fails in the image: {fp['container.torch.version']}")
    if fp.get("container.image") != want:
        bad(
            "container.image",
            f"does not hold the image {want} (holds "
            f"{fp.get('container.image')}): run `invoke provision --roles container`",
        )


def mesh_checks(a, tried: dict, v_of: dict, paper: paper_mesh.PaperMesh) -> list[dict]:
    """One ssh.mesh error per failing pair A -> B: the real login's result where A tried one
    (TRIED: {peer: (rc, error)}; it is the stronger proof), else the on-paper reasons (when
    nodeprep manages the mesh). Costs what fails plus A's tries, not a pass over the fleet."""
    why = {
        b: [f"login failed (exit {rc})" + (f": {err}" if err else "")]
        for b, (rc, err) in tried.items()
        if rc
    }
    if v_of[a.name].get("ssh_mesh"):
        for b, reasons in paper.failing(a.name).items():
            if b not in tried:
                why[b] = reasons
    return [
        {
            "node": a.name,
            "key": "ssh.mesh",
            "severity": "error",
            "message": f"{a.name} -> {b}: " + "; ".join(w),
        }
        for b, w in sorted(why.items(), key=lambda kv: paper.order.get(kv[0], len(paper.order)))
    ]


def compare_fleet(fps: dict, cpu_only: set, checks, unreachable, order):
    """GPU keys are compared among the GPU nodes only: a node the inventory marks cpu_only is
    meant to differ there."""
    is_gpu = lambda k: k.startswith(GPU_KEYS)
    rest = {n: {k: v for k, v in fp.items() if not is_gpu(k)} for n, fp in fps.items()}
    report = parity.compare(rest, SEVERITY, checks, unreachable, order=order)
    gpu = {
        n: {k: v for k, v in fp.items() if is_gpu(k)} for n, fp in fps.items() if n not in cpu_only
    }
    if gpu:
        g = parity.compare(gpu, SEVERITY, (), None, order=[n for n in order if n in gpu])
        report.drift = sorted(
            report.drift + g.drift, key=lambda d: (parity.SEVERITIES.index(d.severity), d.key)
        )
        report.compared_keys += g.compared_keys
    parity.split_by_platform(report, {n: fp.get("cpu.arch") for n, fp in fps.items()})
    return report
