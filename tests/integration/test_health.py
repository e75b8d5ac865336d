"""`invoke health` on the lab: each fault on ONE node is named by node and code, every other
node has nothing CRITICAL, and the command exits 1; a healthy lab exits 0. GPU faults come
through GPU-shaped nodes (lab.up --gpu-record) whose recordings are real machines'
(tests/recordings/, sources in SOURCE.md) with at most one element changed, the node-side
faults from the lab itself (a small file system, a small /dev/shm, a memlock limit)."""

from __future__ import annotations

import json
import shutil
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from nodeprep import cli as api
from nodeprep import lab as labmod
from nodeprep.commands.options import FactsOptions, HealthOptions

REC = Path(__file__).resolve().parents[1] / "recordings"
BASE = REC / "gpu" / "telegraf-dual-rtx-a5000"  # 2 GPUs, persistence on, driver 590
BENIGN_LOG = (
    REC / "xid" / "vllm-5901-a800-xid13-graphics-exception.log"
)  # Xid 13: the application's


def _record(
    root: Path, name: str, edit=None, kernel_log: Path | None = BENIGN_LOG, extra=None
) -> Path:
    """A recording dir: the A5000 machine with its recorded process gone (it held the GPUs),
    EDIT(xml root) applied, the kernel log and EXTRA {file: text} beside it."""
    d = root / name
    d.mkdir(parents=True)
    tree = ET.parse(BASE / "nvidia-smi-q.xml")
    for procs in tree.getroot().iter("processes"):
        for p in list(procs):
            procs.remove(p)
    if edit:
        edit(tree.getroot())
    tree.write(d / "nvidia-smi-q.xml")
    if kernel_log:
        shutil.copyfile(kernel_log, d / "kernel.log")
    for fname, text in (extra or {}).items():
        (d / fname).write_text(text)
    return d


def _set(path: str, value: str, gpu: int = 0):
    def edit(root):
        root.findall("gpu")[gpu].find(path).text = value

    return edit


def _drop_gpu(root):
    root.remove(root.findall("gpu")[1])


NVLINK_OK = "".join(
    f"GPU {g}: NVIDIA RTX A5000 (UUID: GPU-{g})\n"
    + "".join(f"\t Link {k}: 14.062 GB/s\n" for k in range(4))
    for g in range(2)
)
GPU_FAULTS = {
    "uncorrected ECC": (
        "ECC_UNCORRECTED",
        {"edit": _set("ecc_errors/volatile/dram_uncorrectable", "4")},
    ),
    "pending row remap": (
        "REMAP_PENDING",
        {"edit": _set("remapped_rows/remapped_row_pending", "Yes")},
    ),
    "row remap failure": (
        "REMAP_FAILED",
        {"edit": _set("remapped_rows/remapped_row_failure", "Yes", 1)},
    ),
    "PCIe x8 of x16": (
        "PCIE_WIDTH",
        {"edit": _set("pci/pci_gpu_link_info/link_widths/current_link_width", "8x")},
    ),
    "1 of 2 GPUs": ("GPU_COUNT", {"edit": _drop_gpu}),
    "HW slowdown": (
        "CLOCK_HW_SLOWDOWN",
        {"edit": _set("clocks_event_reasons/clocks_event_reason_hw_slowdown", "Active")},
    ),
    "Xid 79": ("XID_HW", {"kernel_log": REC / "xid" / "nvsentinel-155-comment-xid79-line.log"}),
    "NVLink down": (
        "NVLINK_DOWN",
        {
            "extra": {
                "nvlink-s.txt": NVLINK_OK.replace(
                    "\t Link 3: 14.062 GB/s\n", "\t Link 3: <inactive>\n", 1
                )
            }
        },
    ),
    "unreadable kernel log": ("KLOG_UNREADABLE", {"kernel_log": None}),
}


@pytest.fixture(scope="module")
def gpu_lab(lab, lab_up, tmp_path_factory):
    """Every node GPU-shaped (the same healthy machine); afterwards the lab as it was."""
    root = tmp_path_factory.mktemp("gpu-records")
    healthy = _record(root, "healthy", extra={"nvlink-s.txt": NVLINK_OK})
    lab_up(gpu_records=(str(healthy),))
    yield root, healthy
    lab_up(gpu_records=("none",))


def _health(lab, settings, capsys, *extra: str) -> tuple[int, dict]:
    code = api.health(
        HealthOptions(inventory=str(lab.inventory), json=True, ignore=tuple(extra)), settings
    )
    return code, json.loads(capsys.readouterr().out)


def _bad(rep: dict) -> list:
    return [
        (f["node"], f["code"], f["verdict"], f["reason"])
        for n in rep["nodes"].values()
        for f in n["findings"]
        if f["verdict"] != "OK"
    ]


def _only(rep: dict, node: str, code: str, verdict: str) -> None:
    """CODE with VERDICT on NODE, nothing CRITICAL anywhere else."""
    mine = {(f["code"], f["verdict"]) for f in rep["nodes"][node]["findings"]}
    assert (code, verdict) in mine, rep["nodes"][node]
    others = {n: v["verdict"] for n, v in rep["nodes"].items() if n != node}
    assert "CRITICAL" not in others.values(), _bad(rep)


def test_a_healthy_gpu_lab_exits_0_and_the_xid_13_is_only_listed(
    gpu_lab, lab, lab_settings, capsys
):
    code, rep = _health(lab, lab_settings, capsys)
    assert code == 0 and rep["unhealthy"] == [], _bad(rep)
    for node in rep["nodes"].values():
        got = {f["code"]: f["verdict"] for f in node["findings"]}
        assert got["SMI_OK"] == "OK" and got["XID_APP"] == "OK", node  # Xid 13: not critical
        assert node["verdict"] in ("OK", "WARN"), node


@pytest.fixture
def dmesg_restricted():
    """kernel.dmesg_restrict=1 (Debian's default) for the test: a plain user cannot read the
    kernel log, as on most clusters; restored after."""
    knob = Path("/proc/sys/kernel/dmesg_restrict")
    before = knob.read_text().strip()
    if before != "1":
        knob.write_text("1\n")
    yield
    if before != "1":
        knob.write_text(before + "\n")


@pytest.mark.parametrize("fault", list(GPU_FAULTS))
def test_a_gpu_fault_on_one_node_is_named(
    gpu_lab, lab, lab_up, lab_settings, capsys, fault, dmesg_restricted
):
    root, healthy = gpu_lab
    code_name, how = GPU_FAULTS[fault]
    bad = _record(root, fault.replace(" ", "-"), **{"extra": {"nvlink-s.txt": NVLINK_OK}, **how})
    lab_up(gpu_records=(f"worker-1={bad}",))
    try:
        code, rep = _health(lab, lab_settings, capsys)
    finally:
        lab_up(gpu_records=(str(healthy),))
    want = "UNKNOWN" if code_name == "KLOG_UNREADABLE" else "CRITICAL"
    _only(rep, "worker-1", code_name, want)
    assert code == (0 if want == "UNKNOWN" else 1), rep


def test_an_nvidia_smi_that_hangs_is_reported_within_its_timeout(
    gpu_lab, lab, lab_up, lab_settings, capsys
):
    root, healthy = gpu_lab
    hung = _record(root, "hang", extra={"nvlink-s.txt": NVLINK_OK, "hang": ""})
    lab_up(gpu_records=(f"worker-2={hung}",))
    try:
        t0 = time.monotonic()
        code, rep = _health(lab, lab_settings, capsys)
        took = time.monotonic() - t0
    finally:
        lab_up(gpu_records=(str(healthy),))
        labmod.node_shell(lab, 2, "pkill -f usr/local/bin/nvidia-smi; true")
    _only(rep, "worker-2", "SMI_HUNG", "UNKNOWN")
    assert took < 15 + 2 + 10, took  # nvidia-smi's timeout, its KILL, the rest


def test_facts_read_a_gpu_shaped_node_as_the_machine(gpu_lab, lab, lab_settings, capsys):
    assert (
        api.facts(FactsOptions(inventory=str(lab.inventory), limit=None, json=True), lab_settings)
        == 0
    )
    out = capsys.readouterr().out
    rep = json.loads(out[out.index("{\n") :])
    gpus = rep["nodes"]["worker-0"]["facts"]["gpus"]
    assert gpus["count"] == 2 and gpus["driver"] == "590.44.01"
    assert gpus["devices"][0] == {
        "name": "NVIDIA RTX A5000",
        "capability": "8.6",
        "memory_mib": 24564,
    }


NODE_FAULTS = {
    "full ~/.nodeprep": (
        "DISK_FULL",
        lambda lab, heal: labmod.limit_space(lab, 1, size=None if heal else "16m"),
    ),
    "small /dev/shm": (
        "SHM_SMALL",
        lambda lab, heal: labmod.limit_shm(lab, 1, None if heal else "64m"),
    ),
    "low memlock": (
        "MEMLOCK_BELOW_FLEET",
        lambda lab, heal: labmod.limit_memlock(lab, 1, None if heal else 64),
    ),
}


@pytest.mark.parametrize("fault", list(NODE_FAULTS))
def test_a_node_fault_is_named(gpu_lab, lab, lab_settings, capsys, fault):
    code_name, make = NODE_FAULTS[fault]
    make(lab, False)
    try:
        code, rep = _health(lab, lab_settings, capsys)
    finally:
        make(lab, True)
    _only(rep, "worker-1", code_name, "CRITICAL")
    assert code == 1


def test_ignore_and_check_select(gpu_lab, lab, lab_settings, capsys):
    labmod.limit_shm(lab, 0, "64m")
    try:
        code, rep = _health(lab, lab_settings, capsys, "SHM_SMALL")
        assert code == 0 and [f["code"] for f in rep["ignored"]] == ["SHM_SMALL"], rep
        assert (
            api.health(
                HealthOptions(inventory=str(lab.inventory), json=True, checks=("shm",)),
                lab_settings,
            )
            == 1
        )
        rep = json.loads(capsys.readouterr().out)
        assert rep["checks"] == ["shm"] and rep["unhealthy"] == ["worker-0"]
    finally:
        labmod.limit_shm(lab, 0, None)
    assert (
        api.health(HealthOptions(inventory=str(lab.inventory), checks=("gpus",)), lab_settings) == 2
    )
