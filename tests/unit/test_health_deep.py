"""The deep tier's judgement (ops/health/deep.py) on recorded answers: DCGM's JSON from real
runs (tests/facts/dcgm_diag/, sources in tests/recordings/dcgm/SOURCE.md), the GPU program's
line from real runs on this machine (tests/facts/gpu_deep/: torch 2.13.0+cpu, no GPU), GPU
nodes' nvidia-smi -q -x from real machines (tests/recordings/gpu/). Where a GPU's answer is
needed the recorded CPU line is edited (its GPU names and figures), said at each place: no
GPU was lent to record one."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from nodeprep import cli as api
from nodeprep.commands.health import judge
from nodeprep.commands.options import HealthOptions
from nodeprep.commands.train import gate
from nodeprep.engine.facts import FactValues
from nodeprep.engine.facts.gpudeep import DCGM_DIAG, GPU_DEEP, parse_dcgm
from nodeprep.engine.facts.gpuhealth import GPU_DETAIL
from nodeprep.ops.health import catalogue, deep
from nodeprep.ops.health.findings import Context, Verdict

ROOT = Path(__file__).resolve().parents[1]
FACTS = ROOT / "facts"
V100S = ROOT / "recordings" / "gpu" / "datakit-8x-v100s-pcie" / "nvidia-smi-q.xml"


def case(fact: str, name: str):
    return json.loads((FACTS / fact / f"{name}.json").read_text())["expected"]


def node(detail=None, dcgm=None, prog=None) -> FactValues:
    cpu = {"present": False, "state": "absent", "devices": 0}
    return FactValues(
        {
            GPU_DETAIL.key: detail or cpu,
            DCGM_DIAG.key: dcgm or {"state": "absent"},
            GPU_DEEP.key: prog or case("gpu_deep", "no_venv"),
        }
    )


def gpu_detail(names: list[str]) -> dict:
    """The 8x V100S recording (real), with its product names as NAMES when they differ."""
    d = GPU_DETAIL.parse(V100S.read_text() + "\n@@SMI_RC=0@@", 0)
    d = copy.deepcopy(d)
    d["gpus"] = [dict(d["gpus"][i % 8], index=i, name=n) for i, n in enumerate(names)]
    return d


def gpu_line(names: list[str], tflops=14.0, busbw=None, **ar) -> dict:
    """The recorded emulated run's line, EDITED into one from GPUs NAMES (no GPU recorded)."""
    d = copy.deepcopy(case("gpu_deep", "emulated_2_cpu"))
    d.update(cuda=True, device="cuda")
    d["gpus"] = [dict(d["gpus"][0], index=i, name=n, tflops=tflops) for i, n in enumerate(names)]
    d["allreduce"] = (
        None
        if len(names) < 2
        else dict(d["allreduce"], world=len(names), bytes=16 << 30, busbw_gbps=busbw or 470.0, **ar)
    )
    return d


def codes(check, f, ctx=None) -> dict:
    return {c: v for c, v, _r, _f in check(f, ctx or Context())}


H100 = ["NVIDIA H100 80GB HBM3"] * 8


def test_floors_name_their_source_and_match_by_model_and_count():
    assert deep.floor_for("NVIDIA H100 80GB HBM3", 8)["busbw_gbps"] == 460.0
    assert deep.floor_for("NVIDIA A100-SXM4-80GB", 8)["busbw_gbps"] == 228.0
    assert deep.floor_for("NVIDIA H200", 8)["busbw_gbps"] == 431.0
    assert (
        deep.floor_for("NVIDIA H100 PCIe", 8) is None
        and deep.floor_for("NVIDIA H100 80GB HBM3", 4) is None
    )
    assert deep.floor_for("NVIDIA H200 NVL", 8) is None
    assert all("azurehpc-health-checks" in f["source"] for f in deep.floors())
    assert deep.message_bytes(gpu_detail(H100)) == 16 << 30
    assert deep.message_bytes(gpu_detail(["Tesla V100S-PCIE-32GB"] * 8)) == 1 << 30


def test_dcgm_on_real_runs():
    gpu = gpu_detail(["NVIDIA GB10"])
    # DCGM 4.5.2 on a GB10: software Fail with severity 5 (CONFIG: persistence mode off) = a warning
    got = deep.dcgm(node(gpu, case("dcgm_diag", "dcgm4_gb10_r2_software_fail")), Context())
    assert [(c, v) for c, v, _r, _f in got] == [
        ("DCGM_WARN", Verdict.WARN)
    ] and "Persistence" in got[0][2]
    assert codes(deep.dcgm, node(gpu, case("dcgm_diag", "dcgm3_nvvs_8gpu_all_pass"))) == {
        "DCGM_PASS": Verdict.OK
    }
    assert codes(deep.dcgm, node(gpu, case("dcgm_diag", "timed_out"))) == {
        "DCGM_HUNG": Verdict.UNKNOWN
    }
    missing = deep.dcgm(node(gpu, case("dcgm_diag", "no_dcgmi")), Context())
    assert [(c, v) for c, v, _r, _f in missing] == [
        ("DCGM_MISSING", Verdict.UNKNOWN)
    ] and "install" in missing[0][3]
    assert deep.dcgm(node(None, case("dcgm_diag", "no_dcgmi")), Context()) == []  # a CPU node


def test_dcgm_a_hardware_failure_is_critical():
    """The 4.5.2 recording with ONE change: memory Fail with an ISOLATE (2) warning."""
    out = json.loads((FACTS / "dcgm_diag" / "dcgm4_gb10_r2_software_fail.json").read_text())[
        "output"
    ]
    body, _, rc = out.rpartition("\n@@rc")
    doc = json.loads(body)
    mem = doc["DCGM Diagnostic"]["test_categories"][1]["tests"][0]
    assert mem["name"] == "memory"
    mem["results"][0]["status"] = "Fail"
    mem["results"][0]["warnings"] = [
        {
            "error_category": 1,
            "error_id": 54,
            "error_severity": 2,
            "warning": "GPU 0 had uncorrectable memory errors",
        }
    ]
    d = parse_dcgm(json.dumps(doc) + "\n@@rc" + rc, 0)
    got = codes(deep.dcgm, node(gpu_detail(["NVIDIA GB10"]), d))
    assert got == {"DCGM_FAIL": Verdict.CRITICAL, "DCGM_WARN": Verdict.WARN}


def test_burn_on_the_recorded_emulated_run_and_on_edited_gpu_lines():
    emu = case("gpu_deep", "emulated_2_cpu")
    assert codes(deep.burn, node(None, prog=emu), Context(emulate_gpus=2)) == {
        "BURN_OK": Verdict.OK
    }
    assert deep.burn(node(None, prog=emu), Context()) == []  # a CPU node, not emulated
    uneven = json.loads(json.dumps(emu))  # CPU devices share the cores: a rate says nothing
    uneven["gpus"][1]["tflops"] = uneven["gpus"][0]["tflops"] * 0.3
    assert codes(deep.burn, node(None, prog=uneven), Context(emulate_gpus=2)) == {
        "BURN_OK": Verdict.OK
    }
    gpu = gpu_detail(H100)
    assert codes(deep.burn, node(gpu, prog=gpu_line(H100))) == {"BURN_OK": Verdict.OK}
    bad = gpu_line(H100)
    bad["gpus"][3]["self_mismatch"] = 2
    bad["gpus"][5]["max_diff"] = 0.4
    bad["gpus"][6]["tflops"] = 9.0
    bad["gpus"][7] = {
        "index": 7,
        "name": H100[0],
        "error": "RuntimeError: CUDA error: unspecified launch failure",
    }
    got = deep.burn(node(gpu, prog=bad), Context())
    assert {(c, v) for c, v, _r, _f in got} == {
        ("BURN_MISMATCH", Verdict.CRITICAL),
        ("BURN_DISAGREE", Verdict.CRITICAL),
        ("BURN_SLOW", Verdict.WARN),
        ("BURN_ERROR", Verdict.CRITICAL),
    }
    assert any("GPU 3" in r for _c, _v, r, _f in got) and any("GPU 6" in r for _c, _v, r, _f in got)


def test_what_the_burn_cannot_see_is_unknown_with_the_fix():
    gpu = gpu_detail(H100)
    assert codes(deep.burn, node(gpu, prog=case("gpu_deep", "no_venv"))) == {
        "DEEP_NO_TORCH": Verdict.UNKNOWN
    }
    no_cuda = deep.burn(node(gpu, prog=case("gpu_deep", "cpu_torch_no_gpu")), Context())
    assert [(c, v) for c, v, _r, _f in no_cuda] == [
        ("DEEP_NO_CUDA", Verdict.UNKNOWN)
    ] and "torch-plan" in no_cuda[0][3]
    assert codes(deep.burn, node(gpu, prog=case("gpu_deep", "venv_without_torch"))) == {
        "DEEP_ERROR": Verdict.UNKNOWN
    }
    assert codes(deep.burn, node(gpu, prog=case("gpu_deep", "stopped_by_timeout"))) == {
        "DEEP_HUNG": Verdict.CRITICAL
    }


def test_allreduce_against_the_floor():
    gpu = gpu_detail(H100)
    ok = deep.allreduce(node(gpu, prog=gpu_line(H100, busbw=470.0)), Context())
    assert [c for c, *_ in ok] == ["ALLREDUCE_OK"] and "nd96isr_h100_v5" in ok[0][2]
    slow = deep.allreduce(node(gpu, prog=gpu_line(H100, busbw=300.0)), Context())
    assert [(c, v) for c, v, _r, _f in slow] == [
        ("ALLREDUCE_SLOW", Verdict.CRITICAL)
    ] and "460" in slow[0][2]
    # the inventory's floor wins over the table, and gives one where the table has none
    assert codes(
        deep.allreduce,
        node(gpu, prog=gpu_line(H100, busbw=470.0)),
        Context(allreduce_floor_gbps=480.0),
    ) == {"ALLREDUCE_SLOW": Verdict.CRITICAL}
    v100 = ["Tesla V100S-PCIE-32GB"] * 8
    assert codes(deep.allreduce, node(gpu_detail(v100), prog=gpu_line(v100, busbw=20.0))) == {
        "ALLREDUCE_NO_FLOOR": Verdict.UNKNOWN
    }
    assert codes(
        deep.allreduce,
        node(gpu_detail(v100), prog=gpu_line(v100, busbw=20.0)),
        Context(allreduce_floor_gbps=15),
    ) == {"ALLREDUCE_OK": Verdict.OK}
    assert codes(deep.allreduce, node(gpu, prog=gpu_line(H100, correct=False))) == {
        "ALLREDUCE_WRONG": Verdict.CRITICAL
    }
    assert codes(
        deep.allreduce, node(gpu, prog=gpu_line(H100, error="DistBackendError: NCCL error"))
    ) == {"ALLREDUCE_FAIL": Verdict.CRITICAL}
    one = ["NVIDIA H100 80GB HBM3"]
    assert codes(deep.allreduce, node(gpu_detail(one), prog=gpu_line(one))) == {
        "ALLREDUCE_NA": Verdict.OK
    }
    emu = case("gpu_deep", "emulated_2_cpu")
    assert codes(deep.allreduce, node(None, prog=emu), Context(emulate_gpus=2)) == {
        "ALLREDUCE_NO_FLOOR": Verdict.UNKNOWN
    }


def test_the_deep_tier_is_opt_in_and_never_in_the_gate():
    passive = {c.name for c in catalogue.select()}
    deep_names = {"dcgm_diag", "gpu_burn", "allreduce_node"}
    assert not passive & deep_names and deep_names <= {c.name for c in catalogue.select(deep=True)}
    assert [c.name for c in catalogue.select(("gpu_burn",))] == ["gpu_burn"]
    assert not deep_names & {c.name for c in gate.CHECKS}


def test_one_cause_is_shown_once():
    f = {"n": node(gpu_detail(H100), prog=case("gpu_deep", "no_venv"))}
    got = judge(catalogue.select(("gpu_burn", "allreduce_node")), f, {"n": Context()})
    assert [x.code for x in got] == ["DEEP_NO_TORCH"]


@pytest.mark.parametrize(
    "opts",
    [
        HealthOptions(inventory="nowhere", emulate_gpus=2),
        HealthOptions(inventory="nowhere", burn_seconds=5),
        HealthOptions(inventory="nowhere", deep=True, emulate_gpus=99),
    ],
)
def test_deep_options_need_the_deep_tier_and_sane_values(opts, capsys):
    assert api.health(opts) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "Traceback" not in err
