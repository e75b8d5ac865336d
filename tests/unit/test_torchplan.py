"""torch wheel selection: one data file per real fleet (tests/torchplan/<case>.json), run by one
parametrized test, plus the rule's corners, node spec parsing and the CLI's output and exit codes.

A node in a case is a --node spec string, or {"name", "arch", "cpu_only", "nvidia_smi": raw probe
output} so that real nvidia-smi formats (R470 fallback, driver not loaded) go through gpus.parse.
"""
import json
from pathlib import Path

import pytest

from nodeprep import cli as cli_mod
from nodeprep.commands.options import TorchPlanOptions
from nodeprep.engine.facts import gpus
from nodeprep.ops import torchplan
from nodeprep.errors import InputError
from nodeprep.ops.torchplan import NodeGPU, PlanError, choose, parse_node_spec


def cli(torch, nodes, arch, index, json_mode):
    """`invoke torch-plan` as the task calls it."""
    return cli_mod.torch_plan(TorchPlanOptions(torch, tuple(nodes), arch, index, json_mode))

CASES = sorted((Path(__file__).parents[1] / "torchplan").glob("*.json"))


def _node(n, arch):
    if isinstance(n, str):
        return parse_node_spec(n, arch)
    return torchplan.node_from_facts(n["name"], n.get("arch", arch), gpus.parse(n["nvidia_smi"]),
                                     n.get("cpu_only", False))


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_fleet(case):
    data = json.loads(case.read_text())
    nodes = [_node(n, data.get("arch", "x86_64")) for n in data["nodes"]]
    if "variant" in data["expect"]:
        plan = choose(data["torch"], nodes)
        v = data["expect"]["variant"]
        assert plan.variant == v, plan.reasons
        assert plan.requirement == f"torch=={data['torch']}+{v}"
        assert plan.index_url == f"https://download.pytorch.org/whl/{v}"
        return
    with pytest.raises(PlanError) as e:
        choose(data["torch"], nodes)
    want = data["expect"]["error"]
    assert e.value.node == want["node"]
    for part in want["contains"]:
        assert part in str(e.value), str(e.value)


def test_enough_real_fleets():
    assert len(CASES) >= 15


def test_table_is_consistent():
    """Every confirmed CUDA variant has a known family and every source key is declared; the arch
    lists a GPU selection can use never overlap ambiguously."""
    t = torchplan.table()
    for minor, rel in t["releases"].items():
        for s in ([rel["source"]] if isinstance(rel["source"], str) else rel["source"]):
            assert s in t["sources"], (minor, s)
        for arch in ("x86_64", "aarch64"):
            for v, note in torchplan.published(minor, arch).items():
                assert v == "cpu" or v[2:-1] in t["cuda_families"], (minor, v)
                assert note is None or "unconfirmed" in note or "limited" in note
    for row in t["arch_lists"]:
        for s in ([row["source"]] if isinstance(row["source"], str) else row["source"]):
            assert s in t["sources"]
        for minor in t["releases"]:
            for v in row["variants"]:
                same = [r for r in t["arch_lists"] if v in r["variants"] and r.get("cpu_arch") == row.get("cpu_arch")
                        and torchplan._in_range(minor, r["torch"])]
                assert len(same) <= 1, (minor, v, row)


def test_version_keeps_patch_and_pins_exactly():
    node = parse_node_spec("a:driver=550.54.15,gpu=8.0")
    plan = choose("2.5.1", [node])
    assert (plan.torch, plan.requirement, plan.cuda) == ("2.5.1", "torch==2.5.1+cu124", "12.4")
    assert choose("2.13", [node]).requirement == "torch==2.13.0+cu126"  # X.Y means X.Y.0
    assert choose("2.13.0", [NodeGPU("c", "x86_64", None, [], cpu_only=True)]).requirement == "torch==2.13.0+cpu"


@pytest.mark.parametrize("cap,archs,ptx,ok", [
    ("8.9", ["8.0", "8.6"], False, True),    # sm_86 runs on 8.9: same major, higher minor
    ("8.0", ["8.6", "9.0"], False, False),   # never on a lower minor
    ("10.0", ["8.0", "9.0"], False, False),  # never across majors
    ("10.0", ["8.0", "9.0"], True, True),    # PTX of the newest listed JITs for newer GPUs
    ("11.0", ["10.0", "12.0"], True, False),  # PTX does not go backwards (12.0 PTX on 11.0)
    ("12.1", ["12.0"], False, True),
    ("7.0", ["7.5", "8.0"], True, False),    # PTX is no help for older GPUs
])
def test_coverage_rule(cap, archs, ptx, ok):
    assert torchplan.covers(archs, ptx, cap) is ok


def test_ptx_covers_newer_capability_in_a_fleet():
    plan = choose("2.13.0", [parse_node_spec("next:driver=600.10,gpu=13.0")])
    assert plan.variant == "cu132" and plan.arch_list[-1] == "12.0+PTX"
    with pytest.raises(PlanError, match="sm_130"):
        choose("2.8.0", [parse_node_spec("next:driver=600.10,gpu=13.0")])  # cu12x has no PTX


def test_reasons_explain_every_other_variant():
    plan = choose("2.13.0", [parse_node_spec("h:driver=580.65.06,gpu=9.0"),
                             parse_node_spec("a:driver=535.104.05,gpu=8.0")])
    assert plan.reasons == [
        "cu132: needs driver >= 580 (CUDA 13.x); oldest driver is 535.104.05 on a",
        "cu130: needs driver >= 580 (CUDA 13.x); oldest driver is 535.104.05 on a"]


@pytest.mark.parametrize("spec,caps,driver,arch,cpu_only", [
    ("a:driver=535.104.05,gpu=8.0", ["8.0"], "535.104.05", "x86_64", False),
    ("a:driver=535,gpu=8.0+8.6", ["8.0", "8.6"], "535", "x86_64", False),
    ("a:driver=580.65.06,gpus=4x9.0,arch=aarch64", ["9.0"] * 4, "580.65.06", "aarch64", False),
    ("a:gpus=2xA100,driver=535.104.05", ["8.0"] * 2, "535.104.05", "x86_64", False),
    ("gh:driver=580.82.07,gpu=GH200,arch=arm64", ["9.0"], "580.82.07", "aarch64", False),
    ("login:cpu", [], None, "x86_64", True),
])
def test_parse_node_spec(spec, caps, driver, arch, cpu_only):
    n = parse_node_spec(spec)
    assert (n.capabilities, n.driver, n.arch, n.cpu_only) == (caps, driver, arch, cpu_only)


@pytest.mark.parametrize("spec,says", [
    ("driver=535,gpu=8.0", "NAME:"), ("a:driver=535", "gpu=/gpus="), ("a:gpu=8.0", "driver=VERSION"),
    ("a:driver=535,gpu=8", "compute capability"), ("a:driver=535,gpu=Voodoo5", "known GPU model"),
    ("a:driver=535,gpus=8*8.0", "COUNTxCAP"), ("a:driver=535,gpus=0x8.0", "COUNTxCAP"),
    ("a:cpu,gpu=8.0", "cpu excludes"), ("a:driver=535,gpu=8.0,arch=ppc64le", "arch=ppc64le"),
    ("a:driver=535,gpu=8.0,gpu=9.0", "given twice"), ("a:driver=535,gpu=8.0,mem=80", "'mem=80'"),
    ("a:driver=abc,gpu=8.0", "driver=VERSION"), ("a:", "gpu=/gpus="),
])
def test_parse_node_spec_errors(spec, says):
    with pytest.raises(InputError) as e:
        parse_node_spec(spec)
    assert e.value.exit_code == 2 and "--node" in str(e.value) and says in str(e.value)
    assert "expected NAME:driver=VER" in str(e.value)  # the syntax travels with every error


def test_node_from_facts_keeps_models_and_error():
    n = torchplan.node_from_facts("w", "amd64", gpus.parse("550.120, NVIDIA GeForce RTX 3070, 8.6, 8192 MiB"), False)
    assert (n.arch, n.capabilities, n.models, n.error) == ("x86_64", ["8.6"], ["NVIDIA GeForce RTX 3070"], None)
    unknown = torchplan.node_from_facts("w", "x86_64", gpus.parse(
        'Field "compute_cap" is not a valid field to query.\n@@FALLBACK@@\n470.82.01, Odd GPU, 100 MiB'), False)
    with pytest.raises(PlanError, match="compute capability of Odd GPU unknown"):
        choose("2.3.0", [unknown])
    # A cpu_only node's broken nvidia-smi does not matter: its GPUs are not used.
    ok = torchplan.node_from_facts("c", "x86_64", gpus.parse("No devices were found"), True)
    assert choose("2.3.0", [ok]).variant == "cpu"


def test_cli_text(capsys):
    code = cli("2.13.0", ["h:driver=580.65.06,gpus=8x9.0", "a:driver=535.104.05,gpus=8x8.0"], None, None, False)
    out = capsys.readouterr().out
    assert code == 0
    assert out.splitlines()[:3] == [
        "torch 2.13.0 -> cu126 (CUDA 12.6)",
        "  pip install torch==2.13.0+cu126 --index-url https://download.pytorch.org/whl/cu126",
        "  compiled for: 5.0 6.0 7.0 7.5 8.0 8.6 9.0"]
    assert "PyPI gives cu130" in out and "cu132: needs driver >= 580" in out


def test_cli_json_shape(capsys):
    assert cli("2.7.1", ["b:driver=570.124.06,gpus=8x10.0"], None, "https://mirror/torch/{variant}/", True) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is True
    assert doc["plan"] == {
        "torch": "2.7.1", "variant": "cu128", "index_url": "https://mirror/torch/cu128/",
        "requirement": "torch==2.7.1+cu128", "cuda": "12.8",
        "arch_list": ["7.5", "8.0", "8.6", "9.0", "10.0", "12.0"],
        "reasons": ["cu126: lacks sm_100 (on b)", "cu118: arch list not in the reference (unconfirmed)"],
        "pypi_default": "cu126"}


def test_cli_json_error_and_exit_codes(capsys):
    assert cli("2.6.0", ["b:driver=570.124.06,gpu=B200"], None, None, True) == 1
    err = json.loads(capsys.readouterr().out)["error"]
    assert err["node"] == "b" and "sm_100 (B200 on b) is in no torch 2.6 build" in err["reason"]
    assert err["fix"].startswith("use torch 2.7 (cu128)") and err["exit_code"] == 1
    assert cli("2.6", ["b:driver=570,gpu=B200"], "sparc", None, True) == 2
    assert json.loads(capsys.readouterr().out)["error"]["reason"].startswith("--arch")


@pytest.mark.parametrize("args,code,says", [
    (("2.13.0", ["a:driver=580.65.06,gpu=9.0"], "aarch64", None), 0, "cu130"),   # --arch default for nodes
    (("2.13.0", ["a:driver=535,gpu=8.0"], None, "https://x/whl"), 2, "--index"),
    (("2.13.0+cu130", ["a:cpu"], None, None), 2, "--torch"),
    ((None, ["a:cpu"], None, None), 2, "--torch"),
    (("2.13.0", [], None, None), 2, "at least one node"),
    (("2.13.0", ["a:cpu", "a:cpu"], None, None), 2, "given twice"),
    (("2.13.0", ["a:driver=470.82.01,gpu=7.0"], None, None), 1, "Fix: upgrade its driver"),
    (("3.0", ["a:cpu"], None, None), 1, "not in the table"),
])
def test_cli_exit_codes(capsys, args, code, says):
    assert cli(*args, False) == code
    out = capsys.readouterr()
    assert says in (out.out if code == 0 else out.err)
    if code:
        assert out.err.startswith("error: ") and out.err.count("\n") == 1  # one line, no traceback
