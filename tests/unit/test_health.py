"""Health checks on real recorded outputs (tests/recordings/, sources in SOURCE.md): every
parser on every recording, every check OK and each of its non-OK verdicts. A fault that no
public recording shows (a pending row remap, a HW slowdown) is made by changing ONE element
of a real recording; everything else in it stays as recorded."""

from __future__ import annotations

import copy
import json
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from nodeprep.commands.health import judge
from nodeprep.engine.facts import FactValues
from nodeprep.engine.facts.gpuhealth import FABRIC, GPU_DETAIL, parse_nvlink
from nodeprep.engine.facts.kernellog import KERNEL_LOG, parse_kernel_log
from nodeprep.engine.facts.nodehealth import (
    CLOCK,
    LIMITS,
    NET_LINKS,
    RDMA_PORTS,
    RDMA_PROBE,
    parse_clock,
    parse_limits,
    parse_rdma,
)
from nodeprep.ops.health import catalogue, fleet, gpu, node, nvlink, xids
from nodeprep.ops.health.findings import CheckSpec, Context, Verdict

REC = Path(__file__).resolve().parents[1] / "recordings"
XMLS = sorted(REC.glob("gpu/*/nvidia-smi-q.xml"))
NOW = 1_800_000_000.0


def _xml(name: str) -> str:
    return (REC / "gpu" / name / "nvidia-smi-q.xml").read_text()


def _edit(xml: str, path: str, value: str, gpu_index: int = 0) -> str:
    """The recording with ONE element changed (on one GPU)."""
    root = ET.fromstring(xml)
    el = root.findall("gpu")[gpu_index].find(path)
    assert el is not None, path
    el.text = value
    return ET.tostring(root, encoding="unicode")


def _detail(xml: str | None, rc: int = 0, state_text: str | None = None) -> dict:
    text = state_text if state_text is not None else f"{xml}\n@@SMI_RC={rc}@@"
    return GPU_DETAIL.parse(text, 0)


def _limits(
    memlock="unlimited",
    nofile="1048576",
    avail=20_000_000,
    total=24_000_000,
    shm=(12_000_000, 12_000_000),
):
    shm_line = "shm none none" if shm is None else f"shm {shm[0]} {shm[1]}"
    return parse_limits(
        f"memlock {memlock}\nnofile {nofile}\n"
        f"MemTotal: {total}\nMemAvailable: {avail}\n{shm_line}\n",
        0,
    )


def _room(free_gib=50.0, size_gib=100.0, mount="/home", readonly=False, writable=True, inodes=1000):
    return {
        "dir": mount,
        "mount": mount,
        "free": int(free_gib * 2**30),
        "size": int(size_gib * 2**30),
        "inodes_free": inodes,
        "writable": writable,
        "readonly": readonly,
    }


def facts(
    xml: str | None = None,
    *,
    detail=None,
    klog=None,
    nvlink=None,
    fabric=None,
    limits=None,
    clock=None,
    rdma=None,
    net=None,
    rooms=None,
) -> dict:
    """One node's facts as the probe's parsers give them; a healthy CPU node by default."""
    d = detail or (_detail(xml) if xml else _detail(None, state_text="NO_NVIDIA_SMI 0"))
    if nvlink:
        d = dict(d, nvlink=nvlink)
    f = FactValues(
        {
            GPU_DETAIL.key: d,
            KERNEL_LOG.key: klog or parse_kernel_log("uptime 5000.0\nvia dmesg\n", 0),
            FABRIC.key: fabric or {"nvswitches": 0, "manager": None, "running": False},
            LIMITS.key: limits or _limits(),
            CLOCK.key: clock or {"now": NOW, "sync": ["chronyd"]},
            RDMA_PORTS.key: rdma if rdma is not None else [],
            NET_LINKS.key: net or {"eth0": {"speed_mbps": 100000, "mtu": 9000, "state": "up"}},
        }
    )
    for req, r in zip(
        node.ROOMS, rooms or [_room(mount="/home"), _room(mount="/tmp"), _room(mount="/home")]
    ):
        f[req.key] = r
    return f


def ctx(**kw) -> Context:
    return Context(clock_window=(NOW - 0.05, NOW + 0.05), interface="eth0", **kw)


def codes(check, f, c=None) -> dict[str, Verdict]:
    """{code: verdict} of one node check."""
    return {code: v for code, v, _r, _fix in check(f, c or ctx())}


def run_all(per_node: dict) -> list:
    return judge(catalogue.select(), per_node, {n: ctx() for n in per_node})  # the passive tier


# -- parsers on every recording -----------------------------------------------------------------


@pytest.mark.parametrize("path", XMLS, ids=[p.parent.name for p in XMLS])
def test_every_recording_parses(path):
    d = _detail(path.read_text())
    root = ET.parse(path).getroot()
    assert d["state"] == "ok" and d["driver"] == root.findtext("driver_version").strip()
    assert len(d["gpus"]) == len(root.findall("gpu")) >= 1
    for g, el in zip(d["gpus"], root.findall("gpu")):
        assert g["name"] and g["name"] != "?"
        tag = (
            "clocks_event_reasons"
            if el.find("clocks_event_reasons") is not None
            else "clocks_throttle_reasons"
        )
        assert g["clock_events_tag"] == tag
        width = el.findtext("pci/pci_gpu_link_info/link_widths/max_link_width", "N/A").strip()
        assert g["pcie"]["max_width"] == (
            None if width == "N/A" else int(width.rstrip("x"))
        )  # a vGPU: N/A


def test_recordings_of_known_states():
    t4 = _detail(_xml("telegraf-tesla-t4"))["gpus"][0]
    assert t4["clock_events_tag"] == "clocks_throttle_reasons"  # driver 515: the old name
    assert (t4["pcie"]["width"], t4["pcie"]["max_width"]) == (8, 16)
    assert [p["type"] for p in t4["processes"]] == ["G", "C"]
    a100 = _detail(_xml("telegraf-a100-sxm4-80gb-mig"))["gpus"][0]
    assert a100["mig"] == "Enabled" and a100["clock_events_tag"] == "clocks_event_reasons"
    p100 = _detail(_xml("netdata-tesla-p100-pcie-16gb"))["gpus"][0]
    assert p100["ecc"]["aggregate_corrected"] == 3 and p100["retired"]["pending"] is False
    assert p100["clock_events"]["gpu_idle"] is True
    a5000 = _detail(_xml("telegraf-dual-rtx-a5000"))["gpus"]
    assert [g["remap"]["pending"] for g in a5000] == [False, False] and a5000[0]["ecc"][
        "mode"
    ] == "Disabled"


def test_smi_states():
    assert _detail(None, state_text="NO_NVIDIA_SMI 0")["state"] == "absent"
    assert _detail(None, state_text="NO_NVIDIA_SMI 4")["devices"] == 4
    assert _detail(None, state_text="@@SMI_RC=124@@")["state"] == "hung"
    err = _detail(
        None,
        state_text="NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
        "driver.\n@@SMI_RC=9@@",
    )
    assert err["state"] == "error" and "couldn't communicate" in err["error"]
    assert _detail(None, state_text="<nvidia_smi_log><gpu>\n@@SMI_RC=0@@")["state"] == "error"


def test_kernel_log_stamps_and_unreadable():
    log = parse_kernel_log(
        "uptime 100000.0\nvia dmesg\n"
        + (REC / "xid" / "vllm-5901-a800-xid13-graphics-exception.log").read_text(),
        0,
    )
    assert log["readable"] and abs(log["lines"][0]["age"] - (100000.0 - 93297.027938)) < 1e-6
    bad = parse_kernel_log(
        "uptime 5.0\nunreadable dmesg: read kernel buffer failed: Operation not permitted\n", 0
    )
    assert not bad["readable"] and "Operation not permitted" in bad["error"]


def test_nvlink_recording():
    text = (REC / "gpu-text" / "uozdemir-h100-80gb-hbm3-vm-590-nvlink-s.txt").read_text()
    got = parse_nvlink(text, 0)
    assert (
        got["state"] == "ok"
        and got["gpus"]["0"]["active"] == 18
        and got["gpus"]["0"]["inactive"] == []
    )


def test_rdma_probe_on_a_recorded_sys_tree():
    tree = REC / "ib" / "node-exporter" / "class" / "infiniband"
    out = subprocess.run(
        ["sh", "-c", RDMA_PROBE.replace("/sys/class/infiniband", str(tree))],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    ports = {(p["device"], p["port"]): p for p in parse_rdma(out, 0)}
    assert (
        ports[("mlx4_0", "1")]["state"] == "ACTIVE" and ports[("mlx4_0", "1")]["rate_gbps"] == 40.0
    )
    assert all(p["link_layer"] for p in ports.values())


# -- each GPU check: OK and every non-OK verdict --------------------------------------------------


def test_nvidia_smi_check():
    assert codes(gpu.nvidia_smi, facts()) == {"NO_GPUS": Verdict.OK}
    assert codes(gpu.nvidia_smi, facts(_xml("telegraf-tesla-t4"))) == {"SMI_OK": Verdict.OK}
    assert codes(gpu.nvidia_smi, facts(detail=_detail(None, state_text="NO_NVIDIA_SMI 8"))) == {
        "SMI_MISSING": Verdict.UNKNOWN
    }
    assert codes(gpu.nvidia_smi, facts(detail=_detail(None, state_text="@@SMI_RC=124@@"))) == {
        "SMI_HUNG": Verdict.UNKNOWN
    }
    assert codes(gpu.nvidia_smi, facts(detail=_detail(None, state_text="boom\n@@SMI_RC=9@@"))) == {
        "SMI_ERROR": Verdict.UNKNOWN
    }


def test_persistence():
    assert codes(gpu.persistence, facts(_xml("telegraf-dual-rtx-a5000"))) == {}
    assert codes(gpu.persistence, facts(_xml("telegraf-tesla-t4"))) == {
        "PERSISTENCE_OFF": Verdict.WARN
    }


def test_ecc():
    p100 = _xml("netdata-tesla-p100-pcie-16gb")
    assert codes(gpu.ecc, facts(p100)) == {}  # 3 corrected over its life: fine
    assert codes(gpu.ecc, facts(_edit(p100, "ecc_errors/volatile/double_bit/total", "2"))) == {
        "ECC_UNCORRECTED": Verdict.CRITICAL
    }
    assert codes(gpu.ecc, facts(_edit(p100, "ecc_errors/volatile/single_bit/total", "5000"))) == {
        "ECC_CORRECTED": Verdict.WARN
    }
    a100 = _xml("telegraf-a100-sxm4-80gb-mig")
    assert codes(gpu.ecc, facts(_edit(a100, "ecc_errors/aggregate/sram_uncorrectable", "1"))) == {
        "ECC_UNCORRECTED": Verdict.CRITICAL
    }
    assert codes(gpu.ecc, facts(_edit(a100, "ecc_mode/pending_ecc", "Disabled"))) == {
        "ECC_MODE_PENDING": Verdict.WARN
    }


def test_ecc_split_sram_fields_of_newer_drivers():
    a5000 = _xml("telegraf-dual-rtx-a5000")  # 590: parity / SEC-DED only
    edited = _edit(a5000, "ecc_errors/volatile/sram_uncorrectable_secded", "1")
    assert codes(gpu.ecc, facts(edited)) == {"ECC_UNCORRECTED": Verdict.CRITICAL}


def test_row_remap():
    a5000 = _xml("telegraf-dual-rtx-a5000")
    assert codes(gpu.row_remap, facts(a5000)) == {}
    assert codes(
        gpu.row_remap, facts(_edit(a5000, "remapped_rows/remapped_row_pending", "Yes", 1))
    ) == {"REMAP_PENDING": Verdict.CRITICAL}
    assert codes(
        gpu.row_remap, facts(_edit(a5000, "remapped_rows/remapped_row_failure", "Yes"))
    ) == {"REMAP_FAILED": Verdict.CRITICAL}


def test_retired_pages():
    p100 = _xml("netdata-tesla-p100-pcie-16gb")
    assert codes(gpu.retired_pages, facts(p100)) == {}
    assert codes(
        gpu.retired_pages, facts(_edit(p100, "retired_pages/pending_retirement", "Yes"))
    ) == {"RETIRED_PENDING": Verdict.CRITICAL}
    many = _edit(p100, "retired_pages/multiple_single_bit_retirement/retired_count", "12")
    assert codes(gpu.retired_pages, facts(many)) == {"RETIRED_MANY": Verdict.WARN}


def test_pcie():
    assert codes(gpu.pcie, facts(_xml("telegraf-tesla-t4"))) == {
        "PCIE_WIDTH": Verdict.CRITICAL
    }  # recorded x8/x16
    a5000 = _xml("telegraf-dual-rtx-a5000")  # gen 1 of 4 while idle: power saving, not a fault
    assert codes(gpu.pcie, facts(a5000)) == {}
    tag = "clocks_event_reasons/clocks_event_reason_gpu_idle"
    assert codes(gpu.pcie, facts(_edit(a5000, tag, "Not Active"))) == {"PCIE_GEN": Verdict.WARN}
    limited = (
        "[   12.000000] pci 0000:41:00.0: 126.016 Gb/s available PCIe bandwidth, "
        "limited by 8.0 GT/s PCIe x16 link at 0000:40:01.1 "
        "(capable of 252.048 Gb/s with 16.0 GT/s PCIe x16 link)"
    )
    klog = parse_kernel_log(f"uptime 500.0\nvia dmesg\n{limited}\n", 0)
    assert codes(gpu.pcie, facts(a5000, klog=klog)) == {"PCIE_LIMITED": Verdict.WARN}


def test_clock_events_old_and_new_names():
    t4 = _xml("telegraf-tesla-t4")
    a100 = _xml("telegraf-a100-sxm4-80gb-mig")
    assert codes(gpu.clock_events, facts(t4)) == {} and codes(gpu.clock_events, facts(a100)) == {}
    hw_old = _edit(t4, "clocks_throttle_reasons/clocks_throttle_reason_hw_slowdown", "Active")
    hw_new = _edit(
        a100, "clocks_event_reasons/clocks_event_reason_hw_power_brake_slowdown", "Active"
    )
    sw = _edit(a100, "clocks_event_reasons/clocks_event_reason_sw_thermal_slowdown", "Active")
    assert codes(gpu.clock_events, facts(hw_old)) == {"CLOCK_HW_SLOWDOWN": Verdict.CRITICAL}
    assert codes(gpu.clock_events, facts(hw_new)) == {"CLOCK_HW_SLOWDOWN": Verdict.CRITICAL}
    assert codes(gpu.clock_events, facts(sw)) == {"CLOCK_SW_THERMAL": Verdict.WARN}


def test_nvlink_down_against_the_nodes_other_gpus():
    text = (REC / "gpu-text" / "uozdemir-h100-80gb-hbm3-vm-590-nvlink-s.txt").read_text()
    two = text + "\n" + text.replace("GPU 0:", "GPU 1:")
    a5000 = _xml("telegraf-dual-rtx-a5000")
    ok = parse_nvlink(two, 0)
    assert codes(nvlink.nvlink, facts(a5000, nvlink=ok)) == {}
    lines = two.splitlines()
    last = max(i for i, ln in enumerate(lines) if "Link 17:" in ln)
    lines[last] = lines[last].split(":")[0] + ": <inactive>"
    down = parse_nvlink("\n".join(lines), 0)
    assert codes(nvlink.nvlink, facts(a5000, nvlink=down)) == {"NVLINK_DOWN": Verdict.CRITICAL}
    assert codes(nvlink.nvlink, facts(a5000, nvlink={"state": "hung", "gpus": {}})) == {
        "NVLINK_UNKNOWN": Verdict.UNKNOWN
    }


CASES = Path(__file__).resolve().parents[1] / "facts" / "gpu_detail"


def _case(name: str) -> dict:
    """A GPU_DETAIL fact case's parsed value (tests/facts/gpu_detail/, sources in its README.md),
    as the probe hands it to the checks."""
    return json.loads((CASES / f"{name}.json").read_text())["expected"]


# Every nvlink -s shape a driver is known to print (and two invented ones, said so in their
# notes): its verdict. A shape not understood is UNKNOWN, never OK.
NVLINK_SHAPES = {
    "nvlink_a100_sxm4_x8_gpu6_all_inactive": {"NVLINK_DOWN": Verdict.CRITICAL},
    "nvlink_a100_sxm4_x8_every_gpu_all_inactive": {"NVLINK_DOWN": Verdict.CRITICAL},
    "nvlink_a100_sxm4_links_25gbs": {},
    "nvlink_h100_pcie_x2_bridged_12_up_6_inactive": {},
    "nvlink_v100_sxm2_links_3_and_5_inactive": {"NVLINK_DOWN": Verdict.CRITICAL},
    "nvlink_a100_pcie_x2_all_inactive_no_bridge": {"NVLINK_NONE": Verdict.WARN},
    "nvlink_rtx2080super_single_all_inactive": {},
    "nvlink_l40s_device_does_not_have_nvlink": {},
    "nvlink_empty_driver580_no_nvlink": {},
    "nvlink_h100_mig_not_supported": {"NVLINK_MIG": Verdict.UNKNOWN},
    "nvlink_error_device_handle": {"NVLINK_UNKNOWN": Verdict.UNKNOWN},
    "nvlink_unrecognised_link_value": {"NVLINK_UNKNOWN": Verdict.UNKNOWN},
    "nvlink_unrecognised_message": {"NVLINK_UNKNOWN": Verdict.UNKNOWN},
    "nvlink_hung": {"NVLINK_UNKNOWN": Verdict.UNKNOWN},
}


def test_every_nvlink_case_has_a_verdict():
    assert sorted(p.stem for p in CASES.glob("nvlink_*.json")) == sorted(NVLINK_SHAPES)


@pytest.mark.parametrize("name", sorted(NVLINK_SHAPES))
def test_nvlink_shapes(name):
    assert codes(nvlink.nvlink, facts(detail=_case(name))) == NVLINK_SHAPES[name]


def test_a_gpu_cut_off_from_nvlink_fails_the_node():
    """Issue 42: one A100-SXM4 of eight whose links are all inactive (Azure's recorded output),
    and every GPU so: the node is CRITICAL, the finding names NVLink and the GPU."""
    one = run_all({"n": facts(detail=_case("nvlink_a100_sxm4_x8_gpu6_all_inactive"))})
    found = [f for f in one if f.check == "nvlink"]
    assert [(f.code, f.verdict) for f in found] == [("NVLINK_DOWN", Verdict.CRITICAL)]
    assert (
        "GPU 6" in found[0].reason
        and "NVLink" in found[0].reason
        and "nvidia-smi -r -i 6" in found[0].fix
    )
    every = run_all({"n": facts(detail=_case("nvlink_a100_sxm4_x8_every_gpu_all_inactive"))})
    found = [f for f in every if f.check == "nvlink"]
    assert [(f.code, f.verdict) for f in found] == [("NVLINK_DOWN", Verdict.CRITICAL)]
    assert (
        "NVLink fabric is down" in found[0].reason and "0, 1, 2, 3, 4, 5, 6, 7" in found[0].reason
    )


def test_all_inactive_everywhere_is_critical_only_where_the_hardware_has_nvlink():
    """PCIe A100s without a bridge print what a dead SXM fabric prints: NVSwitches (or a fabric
    state, or an SXM module) make it CRITICAL; without them it is a WARN; one GPU, nothing."""
    pcie = _case("nvlink_a100_pcie_x2_all_inactive_no_bridge")
    switches = {"nvswitches": 6, "manager": "active", "running": True}
    assert codes(nvlink.nvlink, facts(detail=pcie, fabric=switches)) == {
        "NVLINK_DOWN": Verdict.CRITICAL
    }
    fabric = copy.deepcopy(pcie)
    fabric["gpus"][0]["fabric_state"] = "Completed"
    assert codes(nvlink.nvlink, facts(detail=fabric)) == {"NVLINK_DOWN": Verdict.CRITICAL}
    lone = _case("nvlink_rtx2080super_single_all_inactive")
    assert codes(nvlink.nvlink, facts(detail=lone, fabric=switches)) == {
        "NVLINK_DOWN": Verdict.CRITICAL
    }


def test_nvml_spellings_and_a_message_on_the_gpu_line():
    """Drivers spell it NVLink or Nvlink, inActive; Azure's file, after their edit, inactive."""
    first = _case("nvlink_a100_sxm4_x8_gpu6_all_inactive")["nvlink"]["gpus"]["6"]
    azure_now = (
        "GPU 6: NVIDIA A100-SXM4-80GB (UUID: GPU-9667d95e-6d22-0c22-1f57-c481f13e7c44)\n"
        "NVML: Unable to retrieve NVLink information as all links are inactive\n"
    )
    assert parse_nvlink(azure_now, 0)["gpus"]["6"] == first
    same_line = parse_nvlink(
        "GPU 0: NVIDIA RTX A4000 (UUID: GPU-a) Device does not have or support Nvlink\n", 0
    )
    assert (
        same_line["gpus"]["0"]["status"] == "no_nvlink"
        and same_line["gpus"]["0"]["name"] == "NVIDIA RTX A4000"
    )
    assert same_line["unknown"] == []


def test_a_gpu_line_alone_beside_linked_gpus_is_not_read_as_healthy():
    """No driver is known to print a GPU line with nothing under it: among GPUs with links up,
    it is UNKNOWN; alone (no GPU has links) it is a GPU without NVLink, as the empty output."""
    text = (REC / "gpu-text" / "uozdemir-h100-80gb-hbm3-vm-590-nvlink-s.txt").read_text()
    a5000 = _xml("telegraf-dual-rtx-a5000")
    assert codes(
        nvlink.nvlink, facts(a5000, nvlink=parse_nvlink(text + "GPU 1: NVIDIA H100 80GB HBM3\n", 0))
    ) == {"NVLINK_UNKNOWN": Verdict.UNKNOWN}
    assert (
        codes(nvlink.nvlink, facts(a5000, nvlink=parse_nvlink("GPU 0: NVIDIA RTX A5000\n", 0)))
        == {}
    )


def _klog(*names, uptime=100000.0) -> dict:
    text = "".join((REC / "xid" / n).read_text() for n in names)
    return parse_kernel_log(f"uptime {uptime}\nvia dmesg\n{text}", 0)


def test_xid_hardware_application_and_window():
    t4 = _xml("telegraf-tesla-t4")
    assert codes(gpu.xid, facts(t4, klog=_klog("nvsentinel-155-comment-xid79-line.log"))) == {
        "XID_HW": Verdict.CRITICAL
    }
    assert (
        codes(gpu.xid, facts(t4, klog=_klog("gpud-h100-xe9680-xid119-gsp-timeout.log")))["XID_HW"]
        is Verdict.CRITICAL
    )
    # Xid 13 is the application's: listed, never held against the node
    assert codes(gpu.xid, facts(t4, klog=_klog("vllm-5901-a800-xid13-graphics-exception.log"))) == {
        "XID_APP": Verdict.OK
    }
    assert codes(
        gpu.xid, facts(t4, klog=_klog("nvforum-rtx5080-xid62-xid154-gsp-watchdog.log"))
    ) == {"XID_HW": Verdict.CRITICAL}
    assert codes(gpu.xid, facts(t4, klog=_klog("nvsentinel-155-fallen-off-bus-no-xid.log"))) == {
        "GPU_OFF_BUS": Verdict.CRITICAL
    }
    # older than the window (2 h): 93297 s after boot, the node up for 2 days
    assert (
        codes(
            gpu.xid,
            facts(t4, klog=_klog("vllm-5901-a800-xid13-graphics-exception.log", uptime=200000)),
        )
        == {}
    )
    unreadable = parse_kernel_log(
        "uptime 5.0\nunreadable dmesg: read kernel buffer failed: Operation not permitted\n", 0
    )
    found = gpu.xid(facts(t4, klog=unreadable), ctx())
    assert [(c, v) for c, v, _r, _f in found] == [("KLOG_UNREADABLE", Verdict.UNKNOWN)]
    assert "dmesg_restrict" in found[0][3]
    assert gpu.xid(facts(klog=unreadable), ctx()) == []  # no GPUs: not needed


def test_xid_each_code_once_per_gpu():
    evs = xids.events(_klog("vllm-5901-a800-xid13-graphics-exception.log")["lines"])
    assert len(evs) > 1 and {e.code for e in evs} == {13}
    found = gpu.xid(
        facts(_xml("telegraf-tesla-t4"), klog=_klog("vllm-5901-a800-xid13-graphics-exception.log")),
        ctx(),
    )
    assert len(found) == 1 and f"x{len(evs)}" in found[0][2]


def test_fabric_manager():
    assert codes(gpu.fabric_manager, facts(_xml("telegraf-tesla-t4"))) == {}
    f = facts(
        _xml("telegraf-tesla-t4"), fabric={"nvswitches": 4, "manager": "inactive", "running": False}
    )
    assert codes(gpu.fabric_manager, f) == {"FABRIC_MANAGER_DOWN": Verdict.CRITICAL}


def test_busy_gpu_counts_compute_processes_only():
    t4 = _xml("telegraf-tesla-t4")  # Xorg (G) and python (C)
    assert codes(gpu.busy, facts(t4)) == {"GPU_BUSY": Verdict.CRITICAL}
    root = ET.fromstring(t4)
    procs = root.find("gpu/processes")
    for p in [p for p in procs if p.findtext("type") == "C"]:
        procs.remove(p)
    assert codes(gpu.busy, facts(ET.tostring(root, encoding="unicode"))) == {}


# -- node checks -----------------------------------------------------------------------------------


def test_disk():
    assert codes(node.disk, facts()) == {}
    full = [
        _room(free_gib=0.2, mount="/home"),
        _room(mount="/tmp"),
        _room(free_gib=0.2, mount="/home"),
    ]
    found = node.disk(facts(rooms=full), ctx())
    assert [(c, v) for c, v, _r, _f in found] == [
        ("DISK_FULL", Verdict.CRITICAL)
    ]  # one line per file system
    low = [_room(free_gib=3, mount="/home"), _room(mount="/tmp"), _room(mount="/nodeprep")]
    assert codes(node.disk, facts(rooms=low)) == {"DISK_LOW": Verdict.WARN}
    ro = [_room(mount="/home", readonly=True), _room(mount="/tmp"), _room(mount="/home")]
    assert codes(node.disk, facts(rooms=ro)) == {"DISK_READONLY": Verdict.CRITICAL}
    inodes = [_room(mount="/home"), _room(mount="/tmp", inodes=0), _room(mount="/home")]
    assert codes(node.disk, facts(rooms=inodes)) == {"DISK_FULL": Verdict.CRITICAL}


def test_memory_shm_limits():
    assert codes(node.memory, facts(limits=_limits(avail=500_000))) == {"MEM_LOW": Verdict.CRITICAL}
    assert codes(node.memory, facts(limits=_limits(avail=2_000_000))) == {"MEM_LOW": Verdict.WARN}
    assert codes(node.shm, facts(limits=_limits(shm=(65536, 65536)))) == {
        "SHM_SMALL": Verdict.CRITICAL
    }
    assert codes(node.shm, facts(limits=_limits(shm=None))) == {"SHM_MISSING": Verdict.CRITICAL}
    assert codes(node.shm, facts()) == {}
    assert codes(node.limits, facts()) == {}
    assert codes(node.limits, facts(limits=_limits(memlock="8192"))) == {}  # no RDMA: not needed
    assert (
        codes(node.limits, facts(_xml("telegraf-tesla-t4"), limits=_limits(memlock="8192"))) == {}
    )
    rdma_node = facts(limits=_limits(memlock="8192"), rdma=_ports())
    assert codes(node.limits, rdma_node) == {"MEMLOCK_LOW": Verdict.CRITICAL}
    assert codes(node.limits, facts(limits=_limits(nofile="1024"))) == {"NOFILE_LOW": Verdict.WARN}


def test_clock():
    assert codes(node.clock, facts()) == {}
    assert codes(node.clock, facts(clock={"now": NOW + 3, "sync": ["chronyd"]})) == {
        "CLOCK_OFFSET": Verdict.WARN
    }
    assert codes(node.clock, facts(clock={"now": NOW - 90, "sync": ["chronyd"]})) == {
        "CLOCK_OFFSET": Verdict.CRITICAL
    }
    assert codes(node.clock, facts(clock={"now": NOW, "sync": []})) == {"TIME_SYNC": Verdict.WARN}
    assert codes(node.clock, facts(clock={"now": None, "sync": ["chronyd"]})) == {
        "CLOCK_UNKNOWN": Verdict.UNKNOWN
    }
    assert parse_clock("now 1800000000.5\nsync chronyd\nsync chronyd\n", 0) == {
        "now": 1800000000.5,
        "sync": ["chronyd"],
    }


# -- fleet checks ---------------------------------------------------------------------------------


def _fleet(check, per_node, interfaces=None) -> dict[tuple[str, str], Verdict]:
    ctxs = {n: Context(interface=(interfaces or {}).get(n, "eth0")) for n in per_node}
    return {(n, code): v for n, code, v, _r, _f in check(per_node, ctxs)}


def test_gpu_count_against_the_same_model():
    a5000 = _xml("telegraf-dual-rtx-a5000")
    root = ET.fromstring(a5000)
    root.remove(root.findall("gpu")[1])
    one = ET.tostring(root, encoding="unicode")
    got = _fleet(
        fleet.gpu_count, {"a": facts(a5000), "b": facts(one), "c": facts(a5000), "cpu": facts()}
    )
    assert got == {("b", "GPU_COUNT"): Verdict.CRITICAL, ("cpu", "GPU_COUNT"): Verdict.CRITICAL}
    hung = facts(
        detail=_detail(None, state_text="@@SMI_RC=124@@")
    )  # UNKNOWN in its own check, not here
    assert _fleet(fleet.gpu_count, {"a": facts(a5000), "h": hung}) == {}
    assert _fleet(fleet.gpu_count, {"x": facts(), "y": facts()}) == {}  # a CPU fleet


def test_mig_and_ecc_modes_equal():
    a100 = _xml("telegraf-a100-sxm4-80gb-mig")
    off = _edit(a100, "mig_mode/current_mig", "Disabled")
    got = _fleet(fleet.mig_mode, {"a": facts(off), "b": facts(off), "c": facts(a100)})
    assert got == {("c", "MIG_MISMATCH"): Verdict.CRITICAL}
    no_ecc = _edit(a100, "ecc_mode/current_ecc", "Disabled")
    assert _fleet(fleet.ecc_mode, {"a": facts(a100), "b": facts(a100), "c": facts(no_ecc)}) == {
        ("c", "ECC_MODE_MISMATCH"): Verdict.WARN
    }


def _ports(state="ACTIVE", rate=400.0):
    return [
        {
            "device": "mlx5_0",
            "port": "1",
            "state": state,
            "rate_gbps": rate,
            "rate": f"{rate:g} Gb/sec (4X NDR)",
            "link_layer": "InfiniBand",
            "phys_state": "LinkUp" if state == "ACTIVE" else "Polling",
        }
    ]


def test_rdma_ports_and_rates():
    ok = {n: facts(rdma=_ports()) for n in "abc"}
    assert _fleet(fleet.rdma, ok) == {}
    got = _fleet(
        fleet.rdma,
        {
            "a": facts(rdma=_ports()),
            "b": facts(rdma=_ports("DOWN")),
            "c": facts(rdma=_ports(rate=200.0)),
            "d": facts(rdma=[]),
        },
    )
    assert got == {
        ("b", "RDMA_PORT_DOWN"): Verdict.CRITICAL,
        ("c", "RDMA_RATE"): Verdict.CRITICAL,
        ("d", "RDMA_MISSING"): Verdict.CRITICAL,
    }
    # a port down on every node (a second port never cabled) is nobody's fault
    assert _fleet(fleet.rdma, {n: facts(rdma=_ports("DOWN")) for n in "ab"}) == {}


def test_limits_below_the_fleets():
    got = _fleet(
        fleet.limits_equal,
        {
            "a": facts(limits=_limits(memlock="8192")),
            "b": facts(limits=_limits(memlock="8192")),
            "c": facts(limits=_limits(memlock="64", nofile="1024")),
        },
    )
    assert got == {
        ("c", "MEMLOCK_BELOW_FLEET"): Verdict.CRITICAL,
        ("c", "NOFILE_BELOW_FLEET"): Verdict.CRITICAL,
    }
    assert _fleet(
        fleet.limits_equal, {"a": facts(), "b": facts(limits=_limits(memlock="8192")), "c": facts()}
    ) == {("b", "MEMLOCK_BELOW_FLEET"): Verdict.CRITICAL}
    assert _fleet(fleet.limits_equal, {"a": facts(), "b": facts()}) == {}


def test_net_link_speed_and_mtu():
    slow = {"eth0": {"speed_mbps": 10000, "mtu": 9000, "state": "up"}}
    small = {"eth0": {"speed_mbps": 100000, "mtu": 1500, "state": "up"}}
    got = _fleet(
        fleet.net_link, {"a": facts(), "b": facts(), "c": facts(net=slow), "d": facts(net=small)}
    )
    assert got == {("c", "NET_SPEED"): Verdict.CRITICAL, ("d", "NET_MTU"): Verdict.CRITICAL}
    assert _fleet(fleet.net_link, {"a": facts()}, {"a": None}) == {
        ("a", "NET_UNKNOWN"): Verdict.UNKNOWN
    }


# -- the catalogue and the command's judging -------------------------------------------------


def test_catalogue_lists_every_code_the_checks_give():
    import re

    given = set()
    for mod in (gpu, node, fleet):
        given |= set(
            re.findall(
                r'\("([A-Z][A-Z_]+)", (?:OK|WARN|UNKNOWN|CRITICAL|verdict)',
                Path(mod.__file__).read_text(),
            )
        )
        given |= set(
            re.findall(
                r'(?:, |\(n, )"([A-Z][A-Z_]+)", (?:OK|WARN|UNKNOWN|CRITICAL)',
                Path(mod.__file__).read_text(),
            )
        )
    given |= {"XID_HW", "XID_WARN", "XID_APP"}
    listed = {c for ch in catalogue.CHECKS for c in ch.codes}
    assert given - listed == set() and len(listed) >= 40


def test_unknown_check_or_code_is_bad_input():
    from nodeprep.errors import NodeprepError

    with pytest.raises(NodeprepError, match="no health check named 'gpus'"):
        catalogue.select(("gpus",))
    with pytest.raises(NodeprepError, match="no finding code 'XID'"):
        catalogue.check_ignored(("XID",))


def _idle(xml: str) -> str:
    root = ET.fromstring(xml)
    for procs in root.iter("processes"):
        for p in list(procs):
            procs.remove(p)
    return ET.tostring(root, encoding="unicode")


def test_a_healthy_fleet_is_all_ok_and_a_crashing_check_does_not_stop_the_rest():
    a5000 = _idle(_xml("telegraf-dual-rtx-a5000"))  # the recording's llama-server gone
    per = {"a": facts(a5000), "b": facts(a5000)}
    found = run_all(per)
    assert {f.verdict for f in found} <= {Verdict.OK}, [f for f in found if f.verdict]
    broken = CheckSpec("broken", "raises", codes={"X": "x"}, facts=(), run=lambda f, c: 1 / 0)
    got = judge(
        (broken, catalogue.BY_NAME["shm"]),
        {"a": facts(limits=_limits(shm=(1024, 1024)))},
        {"a": ctx()},
    )
    assert [(f.code, f.verdict) for f in got] == [
        ("CHECK_ERROR", Verdict.UNKNOWN),
        ("SHM_SMALL", Verdict.CRITICAL),
    ]


def test_recorded_narrow_links_and_a_vgpu_of_mostly_na():
    l4 = _detail(_xml("datarhei-dual-l4"))["gpus"]  # one L4 recorded at x1 of x16
    assert sorted((g["pcie"]["width"], g["pcie"]["max_width"]) for g in l4)[0] == (1, 16)
    found = gpu.pcie(facts(_xml("datarhei-dual-l4")), ctx())
    assert [c for c, _v, _r, _f in found] == ["PCIE_WIDTH"] and "x1 of x16" in found[0][2]
    assert codes(gpu.pcie, facts(_xml("telegraf-a10g"))) == {"PCIE_WIDTH": Verdict.CRITICAL}
    vgpu = facts(_xml("telegraf-grid-p4-1q-vgpu"))  # nearly every field N/A
    got = judge([c for c in catalogue.select() if not c.fleet], {"p4": vgpu}, {"p4": ctx()})
    assert "CHECK_ERROR" not in {f.code for f in got}


def test_eight_v100s_under_load_one_job_on_every_gpu():
    v100 = _xml("datakit-8x-v100s-pcie")  # 8 GPUs, sw_power_cap Active on two
    d = _detail(v100)
    assert (
        len(d["gpus"]) == 8
        and sum(bool(g["clock_events"].get("sw_power_cap")) for g in d["gpus"]) == 2
    )
    assert codes(gpu.clock_events, facts(v100)) == {}  # a power cap under load is no fault
    assert codes(gpu.ecc, facts(v100)) == {} and codes(gpu.pcie, facts(v100)) == {}
    busy = gpu.busy(facts(v100), ctx())
    assert len(busy) == 8 and all(v is Verdict.CRITICAL and "python" in r for _c, v, r, _f in busy)
    root = ET.fromstring(v100)
    root.remove(root.findall("gpu")[7])
    got = _fleet(
        fleet.gpu_count, {"a": facts(v100), "b": facts(ET.tostring(root, encoding="unicode"))}
    )
    assert got == {("b", "GPU_COUNT"): Verdict.CRITICAL}


# -- the train gate -----------------------------------------------------------------------------


def _gate_facts(bad: dict) -> tuple[list, dict, dict]:
    from types import SimpleNamespace

    from nodeprep.engine.facts import INTERFACES, ROUTE

    hosts = [SimpleNamespace(name=f"w{i}", address=f"10.0.0.{i + 1}", vars={}) for i in range(3)]
    out = {}
    for h in hosts:
        f = bad.get(h.name) or facts()
        f[INTERFACES.key] = {"eth0": [h.address]}
        f[ROUTE(hosts[0].address).key] = {"dev": "eth0", "src": h.address, "local": h.name == "w0"}
        out[h.name] = f
    return hosts, out, {h.name: (NOW - 0.05, NOW + 0.05) for h in hosts}


def test_the_gate_refuses_names_node_and_code_or_leaves_the_node_out():
    from nodeprep.commands.options import TrainOptions
    from nodeprep.commands.train import gate
    from nodeprep.engine.events import Events
    from nodeprep.errors import NodeprepError

    hosts, per, windows = _gate_facts({"w1": facts(limits=_limits(shm=(65536, 65536)))})
    with pytest.raises(NodeprepError, match=r"w1: SHM_SMALL: /dev/shm is 64 MiB") as e:
        gate.apply(TrainOptions(), hosts, per, windows, Events())
    assert "--exclude-unhealthy" in e.value.hint
    kept = gate.apply(TrainOptions(exclude_unhealthy=True), hosts, per, windows, Events())
    assert [h.name for h in kept] == ["w0", "w2"]
    assert (
        gate.apply(TrainOptions(health_ignore=("SHM_SMALL",)), hosts, per, windows, Events())
        == hosts
    )
    assert gate.apply(TrainOptions(health_gate=False), hosts, per, windows, Events()) == hosts
    busy = _gate_facts({"w2": facts(_xml("telegraf-tesla-t4"))})  # a GPU held: preflight's to name
    assert "gpu_busy" not in {c.name for c in gate.CHECKS}
    assert sorted((f.node, f.code) for f in gate.critical(*busy, ())) == [
        ("w0", "GPU_COUNT"),
        ("w1", "GPU_COUNT"),
        ("w2", "PCIE_WIDTH"),
    ]
