"""Fact parsers against real-format outputs, one data file per case (tests/facts/<fact>/<case>.json),
plus the probe's section framing."""
import json
from pathlib import Path

import pytest

from nodeprep.engine import facts
from nodeprep.engine.facts import gpus

CASES = sorted((Path(__file__).parents[1] / "facts").glob("*/*.json"))


@pytest.mark.parametrize("case", CASES, ids=[f"{c.parent.name}/{c.stem}" for c in CASES])
def test_fact_parser(case):
    data = json.loads(case.read_text())
    assert facts.ALL[case.parent.name].parse(data["output"], data["rc"]) == data["expected"]


def test_every_fact_has_cases():
    covered = {c.parent.name for c in CASES}
    assert {"gpus", "os", "interfaces", "python"} <= covered


def test_probe_sections_roundtrip():
    script = facts.probe_script([facts.HOSTNAME, facts.PYTHON], {"python": "python3; rm -rf /"}, "abc")
    # The inventory value is quoted into the command, never spliced as shell code.
    assert "'python3; rm -rf /'" in script
    out = "@@abc:0@@\nworker-0\n@@abc:rc=0@@\n@@abc:1@@\nMISSING\n@@abc:rc=0@@\n"
    assert facts.split_sections(out, "abc") == {"0": ("worker-0", 0), "1": ("MISSING", 0)}
    assert facts.parse_sections("n", [facts.HOSTNAME, facts.PYTHON], out, "abc", 0) == {
        "hostname": "worker-0", "python": None}


def test_forged_marker_with_other_token_is_plain_text():
    out = "@@abc:hostname@@\n@@zzz:rc=0@@\nreal\n@@abc:rc=3@@\n"
    assert facts.split_sections(out, "abc") == {"hostname": ("@@zzz:rc=0@@\nreal", 3)}


@pytest.mark.parametrize("name,cap", [
    ("NVIDIA A100-SXM4-40GB", "8.0"), ("NVIDIA A10G", "8.6"), ("NVIDIA A10", "8.6"),
    ("Tesla T4", "7.5"), ("NVIDIA L40S", "8.9"), ("NVIDIA GH200 480GB", "9.0"),
    ("NVIDIA H100 PCIe", "9.0"), ("NVIDIA B200", "10.0"), ("NVIDIA GeForce RTX 5090", "12.0"),
    ("Tesla V100-PCIE-16GB", "7.0"), ("Some Future GPU", None)])
def test_capability_from_name(name, cap):
    assert gpus.capability_from_name(name) == cap


def test_gpu_summary():
    g = gpus.parse("535.104.05, NVIDIA A100-SXM4-80GB, 8.0, 81920 MiB\n" * 2)
    assert gpus.summary(g) == "2x NVIDIA A100-SXM4-80GB (8.0), driver 535.104.05"
    assert gpus.summary(gpus.parse("NO_NVIDIA_SMI")) == "none"
