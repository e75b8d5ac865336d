"""The deep tier (`invoke health --deep`, minutes, on demand): DCGM's diagnostic, a GPU burn
and a single-node all_reduce, judged from DCGM_DIAG and GPU_DEEP (engine/facts/gpudeep.py)
with GPU_DETAIL from the passive probe (which GPUs the node has). A node without GPUs gets
nothing here (unless its GPUs are emulated: `--emulate-gpus N`); a tool that is missing is
UNKNOWN with what to install, never OK."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import yaml

from nodeprep.engine.facts.gpudeep import DCGM_DIAG, DCGM_TIMEOUT, GPU_DEEP
from nodeprep.engine.facts.gpuhealth import GPU_DETAIL
from nodeprep.ops.health.findings import Context, Verdict

OK = Verdict.OK
WARN = Verdict.WARN
UNKNOWN = Verdict.UNKNOWN
CRITICAL = Verdict.CRITICAL
SLOW_GPU = 0.8  # a GPU under this share of its node's fastest GPU of the model: WARN
SOFT = (1, 5)  # DCGM error severities that leave the GPU usable: MONITOR, CONFIG
DISAGREE = 1e-3  # relative difference between two GPUs' answers to the same product
INSTALL_DCGM = (
    "install DCGM (Ubuntu/RHEL: NVIDIA's CUDA repository, package datacenter-gpu-manager-4-core "
    "or datacenter-gpu-manager) and start nv-hostengine, then run health --deep again"
)


@lru_cache(maxsize=1)
def floors() -> list[dict]:
    return yaml.load(
        Path(__file__).with_name("floors.yml").read_text(),  # our own file
        Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader),
    )


def floor_for(model: str, count: int) -> dict | None:
    """The floors.yml entry for COUNT GPUs of MODEL (nvidia-smi's product name), or None."""
    return next((f for f in floors() if f["gpus"] == count and re.search(f["model"], model)), None)


def _size(text: str) -> int:
    m = re.fullmatch(r"(\d+)\s*([KMG]i?B?)?", str(text).strip())
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get((m.group(2) or " ")[0], 1) if m else 1
    return int(m.group(1)) * mult if m else 1 << 30


def _models(f) -> list[str]:
    d = f.get(GPU_DETAIL) or {}
    return [g["name"] for g in d.get("gpus", [])] if d.get("state") == "ok" else []


def has_gpus(f) -> bool:
    d = f.get(GPU_DETAIL) or {}
    return d.get("state") in ("ok", "hung", "error") or bool(d.get("devices"))


def message_bytes(gpu_detail: dict | None) -> int:
    """The all_reduce message for a node: its floor's size where one applies, else 1 GiB."""
    names = [g["name"] for g in (gpu_detail or {}).get("gpus", [])]
    fl = floor_for(names[0], len(names)) if names and len(set(names)) == 1 else None
    return _size(fl["message"]) if fl else 1 << 30


# -- DCGM -----------------------------------------------------------------------------------


def _dcgm_unread(d: dict) -> list | None:
    """The finding of a DCGM_DIAG with no result to judge (dcgmi missing, hung, failed)."""
    if d["state"] == "absent":
        return [
            (
                "DCGM_MISSING",
                UNKNOWN,
                "dcgmi is not on the login PATH: DCGM's diagnostic cannot run",
                INSTALL_DCGM,
            )
        ]
    if d["state"] == "hung":
        return [
            (
                "DCGM_HUNG",
                UNKNOWN,
                f"dcgmi diag did not finish within {DCGM_TIMEOUT} s",
                "is nv-hostengine running (`dcgmi discovery -l`)? look for Xids in the kernel log",
            )
        ]
    if d["state"] == "error":
        return [
            (
                "DCGM_ERROR",
                UNKNOWN,
                f"dcgmi diag gave no result: {d['error'][:200]}",
                "run `dcgmi diag -r 2` on the node; start nv-hostengine if it cannot connect",
            )
        ]
    return None


def dcgm(f, ctx: Context) -> list:
    if not has_gpus(f):
        return []
    d = f[DCGM_DIAG]
    unread = _dcgm_unread(d)
    if unread:
        return unread
    out = []
    # DCGM prints a warning as "Fail": its severity says which (MONITOR and CONFIG: the GPU can
    # work, e.g. persistence mode off; ISOLATE, RESET, TRIAGE, UNKNOWN or none given: it cannot)
    soft = [
        t
        for t in d["tests"]
        if t["status"] == "warn" or t["status"] == "fail" and t["severity"] in SOFT
    ]
    hard = [t for t in d["tests"] if t["status"] == "fail" and t["severity"] not in SOFT]
    for hits, code, verdict in ((hard, "DCGM_FAIL", CRITICAL), (soft, "DCGM_WARN", WARN)):
        if hits:
            what = "; ".join(
                f"{t['name']}"
                + (f" on GPU {t['gpu']}" if t["gpu"] not in (None, "") else "")
                + (f": {t['messages'][0][:160]}" if t["messages"] else "")
                for t in hits[:4]
            )
            out.append(
                (
                    code,
                    verdict,
                    f"dcgmi diag -r 2: {len(hits)} result(s) "
                    f"{'failed' if verdict is CRITICAL else 'warned'}: {what}",
                    "drain the node; act on DCGM's message (reset the GPU, reseat, RMA); "
                    "`dcgmi diag -r 3` for more",
                )
            )
    if not out:
        ran = sum(1 for t in d["tests"] if t["status"] == "pass")
        out.append(
            (
                "DCGM_PASS",
                OK,
                f"dcgmi diag -r 2 (DCGM {d.get('version') or '?'}): {ran} result(s) "
                "passed, none failed",
                "",
            )
        )
    return out


# -- the burn -------------------------------------------------------------------------------


def _deep(f, ctx: Context):
    """(GPU_DEEP's answer, None) or (None, the findings that say why there is nothing to judge)."""
    if not has_gpus(f) and not ctx.emulate_gpus:
        return None, []
    d = f[GPU_DEEP]
    if d["state"] == "novenv":
        return None, [
            (
                "DEEP_NO_TORCH",
                UNKNOWN,
                "the venv with torch is missing: the burn and the all_reduce run on its torch",
                "run `invoke provision` (the venv and torch roles)",
            )
        ]
    if d.get("hung"):
        return None, [
            (
                "DEEP_HUNG",
                CRITICAL,
                "the GPU program did not finish in time (the burn and the "
                "all_reduce are bounded): a GPU or the driver hangs",
                "drain the node; look for Xids "
                "(79, 119) in the kernel log; reset the GPUs or reboot",
            )
        ]
    if d["state"] == "error" or d.get("error"):
        why = d.get("error") or "?"
        verdict = CRITICAL if "CUDA" in why or "NCCL" in why else UNKNOWN
        return None, [
            (
                "DEEP_ERROR",
                verdict,
                f"the GPU program failed: {why[:240]}",
                "run `invoke health --deep --limit NODE` again; a CUDA error here is the GPU's "
                "(look for Xids); an import error is the venv's (`invoke provision`)",
            )
        ]
    if not d["gpus"]:
        return None, [
            (
                "DEEP_NO_CUDA",
                UNKNOWN,
                f"torch {d['torch']} in the venv sees no CUDA device although "
                "the node has NVIDIA GPUs",
                "provision a CUDA build of torch (`invoke torch-plan` "
                "says which); a CPU build cannot burn a GPU",
            )
        ]
    return d, None


def _burn_slow(done: list) -> list:
    """BURN_SLOW for each GPU under SLOW_GPU x its node's fastest GPU of the same model."""
    out = []
    for name in sorted({g["name"] for g in done}):
        same = [g for g in done if g["name"] == name]
        best = max(g["tflops"] for g in same)
        for g in (g for g in same if best and g["tflops"] < SLOW_GPU * best):
            out.append(
                (
                    "BURN_SLOW",
                    WARN,
                    f"GPU {g['index']} ({name}): {g['tflops']:.1f} TFLOPS, under "
                    f"{SLOW_GPU:g}x its node's fastest {name} ({best:.1f})",
                    "look at its clocks (health's clock_events), temperature and power cap",
                )
            )
    return out


def burn(f, ctx: Context) -> list:
    d, why = _deep(f, ctx)
    if d is None:
        return why
    out, gpus = [], d["gpus"]
    failed = [g for g in gpus if g.get("error")]
    for g in failed:
        out.append(
            (
                "BURN_ERROR",
                CRITICAL,
                f"GPU {g['index']}: the burn failed: {g['error'][:200]}",
                "drain the node; look for Xids; reset the GPU or reboot",
            )
        )
    done = [g for g in gpus if not g.get("error")]
    for g in (g for g in done if g["self_mismatch"]):
        out.append(
            (
                "BURN_MISMATCH",
                CRITICAL,
                f"GPU {g['index']} ({g['name']}): {g['self_mismatch']} of "
                f"{g['iters']} products differed from its first answer to the same product",
                "drain the node; the GPU computes wrong results: reset it, and RMA it if it recurs",
            )
        )
    for g in (g for g in done if (g.get("max_diff") or 0) > DISAGREE):
        out.append(
            (
                "BURN_DISAGREE",
                CRITICAL,
                f"GPU {g['index']} ({g['name']}): its product differs from GPU "
                f"{done[0]['index']}'s by {g['max_diff']:.2g} (relative) for the same inputs",
                "drain the node; a GPU that disagrees with its neighbours computes wrong results: "
                "RMA",
            )
        )
    if d["device"] != "cpu":  # emulated devices share the CPU: their rates are scheduling noise
        out += _burn_slow(done)
    if not out:
        rates = [g["tflops"] for g in done]
        emu = (
            " (emulated on the CPU: says nothing of a GPU; rates not compared)"
            if d["device"] == "cpu"
            else ""
        )
        out.append(
            (
                "BURN_OK",
                OK,
                f"{len(done)} device(s) agree, {min(rates):.3g}-{max(rates):.3g} TFLOPS fp32{emu}",
                "",
            )
        )
    return out


# -- the all_reduce -------------------------------------------------------------------------


def _allreduce_broken(ar: dict) -> list | None:
    """The finding of an all_reduce that failed or returned a wrong sum."""
    if ar.get("error"):
        return [
            (
                "ALLREDUCE_FAIL",
                CRITICAL,
                f"all_reduce over the node's {ar['world']} devices failed: {ar['error'][:200]}",
                "run with NCCL_DEBUG=INFO (`invoke train --payload allreduce`); "
                "check NVLink (health's nvlink) and the fabric manager",
            )
        ]
    if not ar["correct"]:
        return [
            (
                "ALLREDUCE_WRONG",
                CRITICAL,
                f"all_reduce over {ar['world']} devices returned a wrong sum",
                "drain the node: a GPU or a link corrupts data; reset the GPUs, RMA if it recurs",
            )
        ]
    return None


def allreduce(f, ctx: Context) -> list:
    d, why = _deep(f, ctx)
    if d is None:
        return why  # the same finding as the burn's: the command shows it once
    ar = d.get("allreduce")
    if ar is None:
        return [("ALLREDUCE_NA", OK, "one GPU: nothing to all_reduce within the node", "")]
    broken = _allreduce_broken(ar)
    if broken:
        return broken
    got = (
        f"{ar['busbw_gbps']:.4g} GB/s busbw at {ar['bytes'] / (1 << 30):.3g} GiB "
        f"over {ar['world']} devices"
    )
    if d["device"] == "cpu":
        return [
            (
                "ALLREDUCE_NO_FLOOR",
                UNKNOWN,
                f"{got}, emulated on the CPU (gloo): no floor applies",
                "run --deep without --emulate-gpus on GPU nodes",
            )
        ]
    models = sorted({g["name"] for g in d["gpus"]})
    fl = floor_for(models[0], ar["world"]) if len(models) == 1 else None
    floor = ctx.allreduce_floor_gbps or (fl and fl["busbw_gbps"])
    if not floor:
        return [
            (
                "ALLREDUCE_NO_FLOOR",
                UNKNOWN,
                f"{got}; no floor known for {ar['world']}x {', '.join(models)}",
                "set health_allreduce_floor_gbps in the inventory "
                "(a healthy node's figure, less a margin)",
            )
        ]
    src = (
        "the inventory's health_allreduce_floor_gbps" if ctx.allreduce_floor_gbps else fl["source"]
    )
    if ar["busbw_gbps"] < floor:
        return [
            (
                "ALLREDUCE_SLOW",
                CRITICAL,
                f"{got}, under the floor {floor:g} GB/s ({src})",
                "drain the node; check NVLink (nvlink), the fabric manager and PCIe (pcie)",
            )
        ]
    return [("ALLREDUCE_OK", OK, f"{got}, floor {floor:g} GB/s ({src})", "")]


FACTS = (GPU_DETAIL,)  # DCGM_DIAG and GPU_DEEP: the deep stage asks them (commands/health)
