"""`invoke health --deep` on the provisioned lab (CPU nodes, torch 2.13.0+cpu in each venv):
with --emulate-gpus the GPU program really runs on every node (the burn on 2 CPU devices, a
gloo all_reduce between 2 processes) and each node's result is judged (no floor applies to a
CPU: UNKNOWN, never OK); on GPU-shaped nodes (a real machine's nvidia-smi recording, no CUDA)
the tier says what it cannot see and how to fix it: no dcgmi, a torch without CUDA."""

from __future__ import annotations

import json
from pathlib import Path

from nodeprep import cli as api
from nodeprep.commands.options import HealthOptions

A5000 = Path(__file__).resolve().parents[1] / "recordings" / "gpu" / "telegraf-dual-rtx-a5000"


def _codes(rep: dict) -> dict[str, dict[str, str]]:
    return {n: {f["code"]: f["verdict"] for f in v["findings"]} for n, v in rep["nodes"].items()}


def test_deep_tier_emulated_on_every_node(provisioned, lab, lab_settings, capsys):
    code = api.health(
        HealthOptions(
            inventory=str(lab.inventory), json=True, deep=True, emulate_gpus=2, burn_seconds=2
        ),
        lab_settings,
    )
    rep = json.loads(capsys.readouterr().out)
    assert code == 0, rep
    for node, got in _codes(rep).items():
        assert got.get("BURN_OK") == "OK" and got.get("ALLREDUCE_NO_FLOOR") == "UNKNOWN", (
            node,
            got,
        )
        assert not any(c.startswith("DCGM_") for c in got), got  # no GPU: DCGM does not apply
    reason = next(
        f["reason"]
        for f in rep["nodes"]["worker-0"]["findings"]
        if f["code"] == "ALLREDUCE_NO_FLOOR"
    )
    assert "over 2 devices" in reason and "emulated" in reason
    # the passive tier still ran beside it
    assert {"disk", "shm", "gpu_burn", "allreduce_node", "dcgm_diag"} <= set(rep["checks"])


def test_deep_tier_on_gpu_shaped_nodes_says_what_it_cannot_see(
    provisioned, lab, lab_up, lab_settings, capsys
):
    lab_up(gpu_records=(f"worker-1={A5000}",))
    try:
        code = api.health(
            HealthOptions(
                inventory=str(lab.inventory),
                json=True,
                checks=("dcgm_diag", "gpu_burn", "allreduce_node"),
            ),
            lab_settings,
        )
    finally:
        lab_up(gpu_records=("none",))
    rep = json.loads(capsys.readouterr().out)
    got = _codes(rep)
    assert got["worker-1"] == {"DCGM_MISSING": "UNKNOWN", "DEEP_NO_CUDA": "UNKNOWN"}, got
    assert got["worker-0"] == {} and code == 0, got  # CPU nodes: nothing to judge
    fixes = {f["code"]: f["fix"] for f in rep["nodes"]["worker-1"]["findings"]}
    assert (
        "datacenter-gpu-manager" in fixes["DCGM_MISSING"] and "torch-plan" in fixes["DEEP_NO_CUDA"]
    )
