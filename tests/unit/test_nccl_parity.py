"""verify-parity's NCCL keys (ops/verify/checks.py): the libnccl each node's torch really maps (from
the probe) and what NCCL's own log said in --collective, as parity keys among GPU nodes only, absent
(never None) where torch is a CPU build or NCCL never ran; and the checks on them."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from nodeprep.engine import facts as F
from nodeprep.nodeside import nccl_probe
from nodeprep.ops.verify import checks, fingerprints, nccllog

V = {"venv_path": "/home/u/.nodeprep/venv", "env_file": "~/.nodeprep/env.sh"}
CPU_TORCH = {
    "version": "2.13.0+cpu",
    "cuda": None,
    "available": False,
    "arch_list": [],
    "nccl": None,
    "device_count": 0,
}
H100 = {
    "present": True,
    "driver": "550.54.15",
    "count": 8,
    "error": None,
    "devices": [{"name": "NVIDIA H100 80GB HBM3", "capability": "9.0", "memory_mib": 81559}] * 8,
}
LOGS = Path(__file__).parents[1] / "facts" / "nccl_log"


def cuda_torch(lib: dict, built: str = "2.21.5") -> dict:
    return {
        "version": "2.5.1+cu124",
        "cuda": "12.4",
        "available": True,
        "arch_list": ["sm_80", "sm_90"],
        "nccl": built,
        "device_count": 8,
        "nccl_lib": lib,
    }


def facts(torch: dict | None, gpus: dict | None = None, ds_env: str | None = None) -> F.FactValues:
    f = F.FactValues()
    f[F.OS.key] = {
        "release": "Ubuntu 22.04.4 LTS",
        "kernel": "5.15.0-105-generic",
        "arch": "x86_64",
    }
    f[F.GPUS.key] = gpus or {
        "present": False,
        "driver": None,
        "count": 0,
        "devices": [],
        "error": None,
    }
    f[F.LOGIN_SHELL.key] = "/bin/bash"
    f[F.INTERFACES.key] = {"eth0": "10.0.0.1"}
    f[F.VENV(V["venv_path"]).key] = {"exists": True, "python": "3.11.9", "packages": {}}
    f[F.TORCH_BUILD(F.TorchIn(V["venv_path"])).key] = torch
    f[F.FILE(fingerprints.DEEPSPEED_ENV).key] = {"exists": ds_env is not None, "content": ds_env}
    f[F.FILE(V["env_file"]).key] = {"exists": False, "content": None}
    return f


def fp_of(f) -> dict:
    return fingerprints.fingerprint(V, f, None, None)


def checks_of(f, fp) -> list[dict]:
    host = SimpleNamespace(name="gpu-0", slots=None)
    return [
        c
        for c in checks.checks_for(host, V, f, fp, fingerprints.Expect())
        if c["key"].startswith(("nccl", "env."))
    ]


def lib_from(stem: str, versions: dict) -> dict:
    """The probe's nccl_lib for a real maps excerpt (tests/facts/nccl_maps), versions given."""
    text = (Path(__file__).parents[1] / "facts" / "nccl_maps" / f"{stem}.maps").read_text()
    found = nccl_probe.mapped("\n".join(ln for ln in text.splitlines() if not ln.startswith("#")))
    return nccl_probe.describe(found, lambda path: versions[path])


def test_cpu_build_has_no_nccl_keys_at_all():
    fp = fp_of(facts(CPU_TORCH))
    assert not [k for k in fp if k.startswith("nccl.")]
    assert (
        fingerprints.with_run(fp, {}) == fp and fingerprints.with_run(dict(fp), None) == fp
    )  # gloo said nothing


def test_cuda_build_keys_are_the_mapped_library():
    lib = lib_from("opt_nccl_via_ld_library_path", {"/opt/nccl/lib/libnccl.so.2.21.5": "2.21.5"})
    fp = fp_of(facts(cuda_torch(lib), H100))
    assert fp["torch.nccl"] == "2.21.5"
    assert (
        fp["nccl.lib.path"] == "/opt/nccl/lib/libnccl.so.2.21.5"
        and fp["nccl.lib.version"] == "2.21.5"
    )


def test_static_nccl_has_a_path_and_no_invented_version():
    fp = fp_of(facts(cuda_torch({"path": "static (in libtorch_cuda.so)", "static": True}), H100))
    assert fp["nccl.lib.path"] == "static (in libtorch_cuda.so)" and "nccl.lib.version" not in fp


def test_two_libraries_mapped_is_an_error():
    a = "/opt/nccl/lib/libnccl.so.2.21.5"
    b = "/tmp/ncclvenv/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2"
    f = facts(cuda_torch(lib_from("two_libnccl_mapped", {a: "2.21.5", b: "2.21.5"})), H100)
    fp = fp_of(f)
    assert fp["nccl.lib.path"] == f"{a}, {b}" and fp["nccl.lib.version"] == "2.21.5, 2.21.5"
    assert [(c["key"], c["severity"]) for c in checks_of(f, fp)] == [("nccl.lib", "error")]


def test_probe_error_is_a_finding_not_a_crash():
    f = facts(cuda_torch({"error": "PermissionError: [Errno 13] /proc/self/maps"}), H100)
    fp = fp_of(f)
    assert fp["nccl.lib.path"].startswith("error: PermissionError") and "nccl.lib.version" not in fp
    assert [(c["key"], c["severity"]) for c in checks_of(f, fp)] == [("nccl.lib", "warning")]


def test_runtime_against_build_version():
    path = "/opt/nccl/lib/libnccl.so.2.21.5"
    same = facts(cuda_torch({"path": path, "version": "2.21.5"}), H100)
    assert checks_of(same, fp_of(same)) == []
    newer = facts(cuda_torch({"path": path, "version": "2.23.4"}), H100)
    (c,) = checks_of(newer, fp_of(newer))
    assert (c["key"], c["severity"]) == (
        "nccl.lib.version",
        "warning",
    ) and "built with NCCL 2.21.5" in c["message"]
    older = facts(cuda_torch({"path": path, "version": "2.18.1"}), H100)
    (c,) = checks_of(older, fp_of(older))
    assert (c["key"], c["severity"]) == ("nccl.lib.version", "error") and "older" in c["message"]
    nover = facts(
        cuda_torch({"path": path, "version_error": "AttributeError: no ncclGetVersion"}), H100
    )
    assert [(c["key"], c["severity"]) for c in checks_of(nover, fp_of(nover))] == [
        ("nccl.lib.version", "warning")
    ]


def test_deepspeed_env_library_path_warns_on_cuda_nodes_only():
    env = "LD_LIBRARY_PATH=/opt/nccl/lib\nNCCL_DEBUG=WARN\n"
    gpu = facts(
        cuda_torch({"path": "/opt/nccl/lib/libnccl.so.2.21.5", "version": "2.21.5"}), H100, env
    )
    assert [(c["key"], c["severity"]) for c in checks_of(gpu, fp_of(gpu))] == [
        ("env.deepspeed.LD_LIBRARY_PATH", "warning")
    ]
    cpu = facts(CPU_TORCH, None, env)
    assert checks_of(cpu, fp_of(cpu)) == []


def logged(name: str) -> dict:
    return nccllog.parse(
        [ln for ln in (LOGS / name).read_text().splitlines() if not ln.startswith("#")]
    )


def fleet() -> dict:
    lib = {
        "path": "/home/u/.nodeprep/venv/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2",
        "version": "2.27.3",
    }
    return {n: fp_of(facts(cuda_torch(lib, "2.27.3"), H100)) for n in ("gpu-0", "gpu-1", "gpu-2")}


def test_a_node_without_the_plugin_drifts_like_any_key():
    fps = fleet()
    ofi = logged("nccl_2.27.3_aws_ofi_nccl_1.16.2_loaded.log")
    for n in ("gpu-0", "gpu-1"):
        fingerprints.with_run(fps[n], ofi)
    fingerprints.with_run(fps["gpu-2"], logged("aws_ofi_nccl_initialization_failed_socket.log"))
    report = checks.compare_fleet(fps, set(), [], {}, ["gpu-0", "gpu-1", "gpu-2"])
    drift = {d.key: (d.severity, [(g.nodes, g.value) for g in d.groups]) for d in report.drift}
    failed = "aws-ofi-nccl; aws-ofi-nccl (initialization failed)"
    assert drift["nccl.run.net_plugin"] == (
        "error",
        [(["gpu-0", "gpu-1"], "aws-ofi-nccl 1.16.2"), (["gpu-2"], failed)],
    )
    assert drift["nccl.run.network"] == (
        "error",
        [(["gpu-0", "gpu-1"], "Libfabric"), (["gpu-2"], "Socket")],
    )
    assert drift["nccl.run.transport"][0] == "warning"  # the failed node logged no channel lines
    assert not report.ok


def test_transport_drift_alone_is_a_warning():
    fps = fleet()
    gdr, plain = "NET/IB/GDRDMA, P2P/CUMEM", "NET/IB, P2P/CUMEM"  # gpu-2: no GPUDirect RDMA
    for n, t in (("gpu-0", gdr), ("gpu-1", gdr), ("gpu-2", plain)):
        fingerprints.with_run(fps[n], {"net_plugin": "none", "network": "IB", "transport": t})
    report = checks.compare_fleet(fps, set(), [], {}, list(fps))
    assert [(d.key, d.severity) for d in report.drift] == [
        ("nccl.run.transport", "warning")
    ] and report.ok


def test_another_libnccl_on_one_node_drifts():
    fps = fleet()
    fps["gpu-1"]["nccl.lib.path"] = "/opt/nccl/lib/libnccl.so.2.21.5"
    fps["gpu-1"]["nccl.lib.version"] = "2.21.5"
    report = checks.compare_fleet(fps, set(), [], {}, list(fps))
    assert {d.key for d in report.drift} == {"nccl.lib.path", "nccl.lib.version"}
    assert all(d.severity == "error" and d.odd_nodes() == ["gpu-1"] for d in report.drift)


def test_cpu_only_node_does_not_drift_on_nccl_keys():
    fps = fleet()
    for fp in fps.values():
        fingerprints.with_run(
            fp, {"net_plugin": "none", "network": "IB", "transport": "NET/IB/GDRDMA"}
        )
    fps["cpu-0"] = fp_of(facts(CPU_TORCH))
    report = checks.compare_fleet(fps, {"cpu-0"}, [], {}, list(fps))
    assert not [d for d in report.drift if d.key.startswith("nccl.")]


def test_rank0_version_against_the_probe():
    fps = fleet()
    assert checks.run_checks(fps, {"gpu-0": {"version": "2.27.3"}, "gpu-1": {}}) == []
    (c,) = checks.run_checks(fps, {"gpu-0": {"version": "2.21.5", "network": "IB"}})
    assert (c["node"], c["key"], c["severity"]) == ("gpu-0", "nccl.lib.version", "error")
    assert "ranks ran NCCL 2.21.5, the probe found 2.27.3" in c["message"]


def test_baseline_compares_run_keys_only_where_both_have_them():
    run = {"net_plugin": "none", "network": "IB", "transport": "NET/IB/GDRDMA"}
    with_run = {n: fingerprints.with_run(dict(fp), run) for n, fp in fleet().items()}
    plain = fleet()
    now, old = fingerprints.for_baseline(plain, with_run, ran=False)  # no --collective now
    assert now == plain and old == plain
    now, old = fingerprints.for_baseline(with_run, plain, ran=True)  # a baseline without it
    assert now == plain and old == plain
    changed = {n: dict(fp) for n, fp in with_run.items()}
    changed["gpu-2"]["nccl.run.network"] = "Socket"
    now, old = fingerprints.for_baseline(changed, with_run, ran=True)
    assert now["gpu-2"]["nccl.run.network"] == "Socket" and old["gpu-2"]["nccl.run.network"] == "IB"
    assert with_run["gpu-2"]["nccl.run.network"] == "IB" and "nccl.run.network" in changed["gpu-0"]
