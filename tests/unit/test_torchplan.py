"""torch wheel selection: one data file per real fleet (tests/torchplan/<case>.json), run by one
parametrized test, plus the rule's corners, node spec parsing and the CLI's output and exit codes.

A node in a case is a --node spec string, or {"name", "arch", "cpu_only", "nvidia_smi": raw probe
output} so that real nvidia-smi formats (R470 fallback, driver not loaded) go through gpus.parse.
"""

import datetime
import json
from pathlib import Path

import pytest

from nodeprep import cli as cli_mod
from nodeprep.commands.options import TorchPlanOptions
from nodeprep.engine.facts import gpus
from nodeprep.errors import InputError
from nodeprep.ops import torchplan
from nodeprep.ops.torchplan import data as td
from nodeprep.ops.torchplan.plan import NodeGPU, PlanError, choose, parse_node_spec


def cli(torch, nodes, arch, index, json_mode):
    """`invoke torch-plan` as the task calls it."""
    return cli_mod.torch_plan(
        TorchPlanOptions(torch=torch, nodes=tuple(nodes), arch=arch, index=index, json=json_mode)
    )


CASES = sorted((Path(__file__).parents[1] / "torchplan").glob("*.json"))


def _node(n, arch):
    if isinstance(n, str):
        return parse_node_spec(n, arch)
    return torchplan.node_from_facts(
        n["name"], n.get("arch", arch), gpus.parse(n["nvidia_smi"]), n.get("cpu_only", False)
    )


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_fleet(case):
    """expect: {"variant": V} (every platform) or {"variants": {arch: V}}, optionally "compat"
    (a build relies on minor-version compatibility) and "ptx" (a GPU runs through PTX JIT);
    or {"error": {"node", "contains": [...]}}."""
    data = json.loads(case.read_text())
    nodes = [_node(n, data.get("arch", "x86_64")) for n in data["nodes"]]
    want = data["expect"]
    if "error" not in want:
        plan = choose(data["torch"], nodes)
        got = {b.cpu_arch: b.variant for b in plan.builds}
        assert got == (want.get("variants") or {a: want["variant"] for a in got}), plan.explain
        for b in plan.builds:
            assert b.requirement == f"torch=={plan.torch}+{b.variant}"
            assert b.index_url == f"https://download.pytorch.org/whl/{b.variant}"
            assert sorted(b.nodes) == sorted(n.name for n in nodes if n.arch == b.cpu_arch)
        if "compat" in want:
            assert any(b.compat for b in plan.builds) is want["compat"], [
                b.compat for b in plan.builds
            ]
            assert all("minor-version compatibility" in b.compat for b in plan.builds if b.compat)
        if "ptx" in want:
            assert any(b.ptx for b in plan.builds) is want["ptx"]
        return
    with pytest.raises(PlanError) as e:
        choose(data["torch"], nodes)
    assert e.value.node == want["error"]["node"]
    for part in want["error"]["contains"]:
        assert part in str(e.value), str(e.value)
    assert (
        f"=> no build: {e.value}" in e.value.explain
    )  # --explain ends with the verdict (then sources)


def test_enough_real_fleets():
    assert len(CASES) >= 45


@pytest.mark.parametrize("minor", [f"2.{m}" for m in range(4, 15)])
def test_aarch64_every_release_from_24_has_a_case(minor):
    """Done-when of issue 17: a GH200/GB200/Arm case per release 2.4..2.14."""
    assert any(
        json.loads(c.read_text())["torch"].startswith(minor + ".") and "aarch64" in c.read_text()
        for c in CASES
    ), minor


def test_table_is_consistent():
    """Every variant has a known CUDA family, every source key is declared, every arch set is
    used and exists, PTX appears only where the reference says a release wheel carries it, and
    an unconfirmed fact is never selectable."""
    t = td.table()
    used = set()
    for minor, rel in t["releases"].items():
        for s in td.sources(rel["source"]):
            assert s in t["sources"], (minor, s)
        for arch in td.PLATFORMS:
            for v, w in td.wheels(minor, arch).items():
                assert v == "cpu" or td.family(v) in t["cuda_families"], (minor, v)
                assert all(s in t["sources"] for s in w.source), (minor, arch, v, w.source)
                assert w.confirmed or not w.selectable
                used.add(w.arch_set)
                if w.ptx:  # only 2.13.0 x86 cu130/cu132 (pytorch 188914, 188925)
                    assert (list(w.ptx), arch, v) in [
                        (["2.13.0"], "x86_64", "cu130"),
                        (["2.13.0"], "x86_64", "cu132"),
                    ]
        if not rel.get("released", True):
            assert all(not w.selectable for a in td.PLATFORMS for w in td.wheels(minor, a).values())
    assert set(t["arch_sets"]) == used - {None}
    for s in t["arch_sets"].values():
        assert all(x in t["sources"] for x in td.sources(s["source"]))
    for g in t["gpu_generations"]:
        assert g.get("confirmed", True) is False or all(
            x in t["sources"] for x in td.sources(g["source"])
        )


@pytest.mark.parametrize(
    "minor,x86,arm",
    [
        ("2.8", "cu126 cu128 cu129", "cu129"),
        ("2.9", "cu126 cu128 cu130", "cu126 cu128 cu130"),
        ("2.10", "cu126 cu128 cu130", "cu126 cu128 cu130"),
        ("2.11", "cu126 cu128 cu130", "cu126 cu128 cu130"),
        ("2.12", "cu126 cu130 cu132", "cu126 cu130 cu132"),
        ("2.13", "cu126 cu129 cu130 cu132", "cu126 cu129 cu130 cu132"),
        ("2.14", "cu126 cu130 cu132", "cu126 cu130 cu132"),
        ("2.15", "", ""),
        ("2.4", "cu118 cu121 cu124", ""),
    ],
)
def test_selectable_variants_match_the_reference(minor, x86, arm):
    """Section 1 of the corrected reference, per platform (the confirmed, pin-selectable ones)."""
    for arch, want in (("x86_64", x86), ("aarch64", arm)):
        got = {v for v, why in td.published(minor, arch).items() if why is None} - {"cpu"}
        assert got == set(want.split()), (minor, arch)


@pytest.mark.parametrize(
    "minor,arch,variant,archs",
    [
        ("2.4", "aarch64", "cu124", "9.0"),
        ("2.6", "aarch64", "cu126", "9.0"),
        ("2.7", "aarch64", "cu128", "9.0 10.0 12.0"),
        ("2.8", "aarch64", "cu129", "9.0 10.0 12.0"),
        ("2.9", "aarch64", "cu126", "8.0 9.0"),
        ("2.11", "aarch64", "cu128", "8.0 9.0 10.0 12.0"),
        ("2.14", "aarch64", "cu132", "8.0 9.0 10.0 11.0 12.0"),
        ("2.13", "x86_64", "cu129", "7.5 8.0 8.6 9.0 10.0 12.0"),
        ("2.10", "x86_64", "cu128", "7.0 7.5 8.0 8.6 9.0 10.0 12.0"),
        ("2.11", "x86_64", "cu128", "7.5 8.0 8.6 9.0 10.0 12.0"),
        ("2.6", "x86_64", "cu118", "3.7 5.0 6.0 7.0 7.5 8.0 8.6 9.0"),
        ("2.7", "x86_64", "cu118", None),
        ("2.13", "aarch64", "cu129", None),
    ],
)
def test_arch_lists_per_platform(minor, arch, variant, archs):
    """Section 3: aarch64 builds have their own lists (never the x86 ones); unknown stays
    unknown."""
    w = td.wheels(minor, arch)[variant]
    assert w.archs == (archs.split() if archs else None)


def test_no_ptx_promised_outside_2130():
    nxt = [parse_node_spec("n:driver=600.10,gpu=13.0")]
    for torch in ("2.9.0", "2.12.0", "2.13.1", "2.14.0"):
        with pytest.raises(PlanError, match="no PTX in this release wheel"):
            choose(torch, nxt)
    assert choose("2.13.0", nxt).builds[0].arch_list[-1] == "12.0+PTX"


def test_unreleased_is_never_offered_as_a_fix():
    """2.15 is in the table (unconfirmed) but no fix message ever names it."""
    fleets = [
        ["b:driver=580.82.07,gpu=13.0"],
        ["v:driver=580.82.07,gpu=7.0"],
        ["g:driver=600,gpu=12.0,arch=aarch64"],
    ]
    refused = set()
    for spec in fleets:
        for minor in ("2.0", "2.8", "2.14"):
            try:
                plan = choose(minor, [parse_node_spec(s) for s in spec])
            except PlanError as e:
                assert "2.15" not in e.fix, e.fix
                refused.add((spec[0][0], minor))
            else:
                assert not any("2.15" in b.requirement for b in plan.builds), plan.builds
    # the refusals whose fixes were checked: the capability 13.0 GPU at every release asked,
    # the aarch64 12.0 one at 2.0 (none refused: nothing checked)
    assert refused == {("b", "2.0"), ("b", "2.8"), ("b", "2.14"), ("g", "2.0")}, refused


@pytest.mark.parametrize(
    "today,branch",
    [
        (datetime.date(2026, 11, 23), "R580 (LTSB, supported until 2028-08)"),
        (
            datetime.date(2026, 1, 10),
            "R535 (LTSB, supported until 2026-06)",
        ),  # R570 PB ends 2026-02
        (datetime.date(2028, 9, 1), None),
    ],
)
def test_fix_recommends_a_supported_branch(today, branch):
    """The lifecycle decides: the oldest branch still supported that reaches the need."""
    assert td.supported_branch("525.60.13", today) == branch
    assert (
        td.supported_branch("570.133.20", datetime.date(2026, 1, 10))
        == "R570 (PB, supported until 2026-02)"
    )


def test_generation_floor_comes_before_any_wheel():
    """A B200 on 560 is refused even for a torch without Blackwell builds: the driver is the
    first fix."""
    with pytest.raises(PlanError) as e:
        choose(
            "2.6.0",
            [parse_node_spec("b:driver=560.35.03,gpu=B200")],
            today=datetime.date(2026, 11, 23),
        )
    assert "needs driver >= 570.133.20" in e.value.reason and "R580" in e.value.fix
    with pytest.raises(PlanError, match="up to the R470 branch"):
        choose("2.0.1", [parse_node_spec("k:driver=535.104.05,gpu=K80")])
    assert choose("2.0.1", [parse_node_spec("k:driver=470.82.01,gpu=K80")]).variant == "cu118"


def test_explain_names_rows_steps_and_sources():
    plan = choose("2.13.0", [parse_node_spec("desk:driver=570.86.15,gpu=RTX 5090")])
    text = "\n".join(plan.explain)
    assert "2.13 x86_64 cu129: 7.5 8.0 8.6 9.0 10.0 12.0" in text and "announce-2.13" in text
    assert "needs driver >= 570 (R570)" in text and "dropped: needs driver >= 580" in text
    assert "4. x86_64: torch==2.13.0+cu129; runs by minor-version compatibility" in text
    assert plan.explain[plan.explain.index("sources:") + 1].startswith("  [")


def test_version_keeps_patch_and_pins_exactly():
    node = parse_node_spec("a:driver=550.54.15,gpu=8.0")
    plan = choose("2.5.1", [node])
    assert (plan.torch, plan.requirement, plan.cuda) == ("2.5.1", "torch==2.5.1+cu124", "12.4")
    assert choose("2.13", [node]).requirement == "torch==2.13.0+cu129"  # X.Y means X.Y.0
    assert (
        choose("2.13.0", [NodeGPU("c", "x86_64", None, capabilities=[], cpu_only=True)]).requirement
        == "torch==2.13.0+cpu"
    )


@pytest.mark.parametrize(
    "cap,archs,ptx,ok",
    [
        ("8.9", ["8.0", "8.6"], False, True),  # sm_86 runs on 8.9: same major, higher minor
        ("8.0", ["8.6", "9.0"], False, False),  # never on a lower minor
        ("10.0", ["8.0", "9.0"], False, False),  # never across majors
        ("10.0", ["8.0", "9.0"], True, True),  # PTX of the newest listed JITs for newer GPUs
        ("11.0", ["10.0", "12.0"], True, False),  # PTX does not go backwards (12.0 PTX on 11.0)
        ("12.1", ["12.0"], False, True),
        ("7.0", ["7.5", "8.0"], True, False),  # PTX is no help for older GPUs
    ],
)
def test_coverage_rule(cap, archs, ptx, ok):
    assert torchplan.covers(archs, ptx, cap) is ok


def test_ptx_covers_newer_capability_in_a_fleet():
    plan = choose("2.13.0", [parse_node_spec("next:driver=600.10,gpu=13.0")])
    assert plan.variant == "cu132" and plan.builds[0].arch_list[-1] == "12.0+PTX"
    assert plan.builds[0].ptx == "sm_130 (on next) through the 12.0 PTX (JIT)"
    with pytest.raises(PlanError, match="sm_130"):
        choose("2.8.0", [parse_node_spec("next:driver=600.10,gpu=13.0")])  # cu12x has no PTX


def test_reasons_explain_every_other_variant():
    plan = choose(
        "2.13.0",
        [
            parse_node_spec("h:driver=580.65.06,gpu=9.0"),
            parse_node_spec("a:driver=535.104.05,gpu=8.0"),
        ],
    )
    assert plan.builds[0].reasons == [
        "cu132: needs driver >= 580 (CUDA 13.x); oldest driver is 535.104.05 on a",
        "cu130: needs driver >= 580 (CUDA 13.x); oldest driver is 535.104.05 on a",
        "cu126: fits too, cu129 is newer",
    ]


@pytest.mark.parametrize(
    "spec,caps,driver,arch,cpu_only",
    [
        ("a:driver=535.104.05,gpu=8.0", ["8.0"], "535.104.05", "x86_64", False),
        ("a:driver=535,gpu=8.0+8.6", ["8.0", "8.6"], "535", "x86_64", False),
        ("a:driver=580.65.06,gpus=4x9.0,arch=aarch64", ["9.0"] * 4, "580.65.06", "aarch64", False),
        ("a:gpus=2xA100,driver=535.104.05", ["8.0"] * 2, "535.104.05", "x86_64", False),
        ("gh:driver=580.82.07,gpu=GH200,arch=arm64", ["9.0"], "580.82.07", "aarch64", False),
        ("login:cpu", [], None, "x86_64", True),
    ],
)
def test_parse_node_spec(spec, caps, driver, arch, cpu_only):
    n = parse_node_spec(spec)
    assert (n.capabilities, n.driver, n.arch, n.cpu_only) == (caps, driver, arch, cpu_only)


@pytest.mark.parametrize(
    "spec,says",
    [
        ("driver=535,gpu=8.0", "NAME:"),
        ("a:driver=535", "gpu=/gpus="),
        ("a:gpu=8.0", "driver=VERSION"),
        ("a:driver=535,gpu=8", "compute capability"),
        ("a:driver=535,gpu=Voodoo5", "known GPU model"),
        ("a:driver=535,gpus=8*8.0", "COUNTxCAP"),
        ("a:driver=535,gpus=0x8.0", "COUNTxCAP"),
        ("a:cpu,gpu=8.0", "cpu excludes"),
        ("a:driver=535,gpu=8.0,arch=ppc64le", "arch=ppc64le"),
        ("a:driver=535,gpu=8.0,gpu=9.0", "given twice"),
        ("a:driver=535,gpu=8.0,mem=80", "'mem=80'"),
        ("a:driver=abc,gpu=8.0", "driver=VERSION"),
        ("a:", "gpu=/gpus="),
    ],
)
def test_parse_node_spec_errors(spec, says):
    with pytest.raises(InputError) as e:
        parse_node_spec(spec)
    assert e.value.exit_code == 2 and "--node" in str(e.value) and says in str(e.value)
    assert "expected NAME:driver=VER" in str(e.value)  # the syntax travels with every error


def test_node_from_facts_keeps_models_and_error():
    n = torchplan.node_from_facts(
        "w", "amd64", gpus.parse("550.120, NVIDIA GeForce RTX 3070, 8.6, 8192 MiB"), False
    )
    assert (n.arch, n.capabilities, n.models, n.error) == (
        "x86_64",
        ["8.6"],
        ["NVIDIA GeForce RTX 3070"],
        None,
    )
    unknown = torchplan.node_from_facts(
        "w",
        "x86_64",
        gpus.parse(
            'Field "compute_cap" is not a valid field to query.\n'
            "@@FALLBACK@@\n470.82.01, Odd GPU, 100 MiB"
        ),
        False,
    )
    with pytest.raises(PlanError, match="compute capability of Odd GPU unknown"):
        choose("2.3.0", [unknown])
    # A cpu_only node's broken nvidia-smi does not matter: its GPUs are not used.
    ok = torchplan.node_from_facts("c", "x86_64", gpus.parse("No devices were found"), True)
    assert choose("2.3.0", [ok]).variant == "cpu"


def test_cli_text(capsys):
    code = cli(
        "2.13.0",
        ["h:driver=580.65.06,gpus=8x9.0", "a:driver=535.104.05,gpus=8x8.0"],
        None,
        None,
        False,
    )
    out = capsys.readouterr().out
    assert code == 0
    assert out.splitlines()[:4] == [
        "torch 2.13.0 -> cu129 (CUDA 12.9)",
        "  pip install torch==2.13.0+cu129 --index-url https://download.pytorch.org/whl/cu129",
        "  compiled for: 7.5 8.0 8.6 9.0 10.0 12.0",
        "  note: runs by minor-version compatibility: driver 535.104.05 on a < 575.51.03 "
        "(CUDA 12.9's own driver): its kernels run, PTX JIT and NVRTC may not",
    ]
    assert (
        "PyPI gives cu130" in out and "cu132: needs driver >= 580" in out and "explain:" not in out
    )


def test_cli_text_per_platform_and_explain(capsys):
    assert (
        cli_mod.torch_plan(
            TorchPlanOptions(
                torch="2.7.1",
                nodes=(
                    "v:driver=580.82.07,gpus=8xV100",
                    "g:driver=580.82.07,gpu=GH200,arch=aarch64",
                ),
                explain=True,
            )
        )
        == 0
    )
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "torch 2.7.1 -> x86_64: cu126, aarch64: cu128"
    assert "x86_64 (v): cu126 (CUDA 12.6)" in out and "aarch64 (g): cu128 (CUDA 12.8)" in out
    assert (
        "  pip install torch==2.7.1+cu128 --index-url https://download.pytorch.org/whl/cu128" in out
    )
    assert "  compiled for: 9.0 10.0 12.0" in out  # the aarch64 list, not the x86 one
    assert "explain:" in out and any(
        line.startswith("  3. no variant fits every platform") for line in out
    )
    assert out[1].startswith(
        "  warning: no one variant fits every platform (x86_64 cu126, aarch64 cu128)"
    )
    assert "one variant fits all with torch 2.6 (cu126)" in out[1]


def test_cli_explain_on_error_goes_to_stderr_after_the_one_line(capsys):
    assert (
        cli_mod.torch_plan(
            TorchPlanOptions(torch="2.13.0", nodes=("b:driver=560.35.03,gpu=B200",), explain=True)
        )
        == 1
    )
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("error: node b: B200 (sm_100, Blackwell) needs driver >= 570.133.20")
    assert err[1] == "explain:" and any("[gpu-operator]" in line for line in err)


def test_cli_json_shape(capsys):
    assert (
        cli(
            "2.7.1",
            ["b:driver=570.148.08,gpus=8x10.0"],
            None,
            "https://mirror/torch/{variant}/",
            True,
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is True
    plan = doc["plan"]
    assert {
        k: plan[k] for k in ("torch", "variant", "requirement", "index_url", "cuda", "pypi_default")
    } == {
        "torch": "2.7.1",
        "variant": "cu128",
        "requirement": "torch==2.7.1+cu128",
        "index_url": "https://mirror/torch/cu128/",
        "cuda": "12.8",
        "pypi_default": "cu126",
    }
    assert plan["builds"] == [
        {
            "cpu_arch": "x86_64",
            "nodes": ["b"],
            "variant": "cu128",
            "index_url": "https://mirror/torch/cu128/",
            "requirement": "torch==2.7.1+cu128",
            "cuda": "12.8",
            "arch_list": ["7.5", "8.0", "8.6", "9.0", "10.0", "12.0"],
            "compat": None,
            "ptx": None,
            "reasons": [
                "cu126: lacks sm_100 (on b) (no PTX listed for this build)",
                "cu118: arch list unconfirmed (2.7 cu118 assumed unchanged from 2.6)",
            ],
        }
    ]
    assert plan["explain"][0].startswith("0. torch 2.7.1: released") and plan["warning"] is None


def test_cli_json_error_and_exit_codes(capsys):
    assert cli("2.6.0", ["b:driver=570.148.08,gpu=B200"], None, None, True) == 1
    err = json.loads(capsys.readouterr().out)["error"]
    assert err["node"] == "b" and "sm_100 (B200 on b) is in no torch 2.6 build" in err["reason"]
    assert err["fix"].startswith("use torch 2.7 (cu128)") and err["exit_code"] == 1
    assert err["explain"][-1].startswith("  [")  # sources close the explanation
    assert cli("2.6", ["b:driver=570,gpu=B200"], "sparc", None, True) == 2
    assert json.loads(capsys.readouterr().out)["error"]["reason"].startswith("--arch")


@pytest.mark.parametrize(
    "args,code,says",
    [
        (
            ("2.13.0", ["a:driver=580.65.06,gpu=9.0"], "aarch64", None),
            0,
            "cu132",
        ),  # --arch default for nodes
        (("2.13.0", ["a:driver=535,gpu=8.0"], None, "https://x/whl"), 2, "--index"),
        (("2.13.0+cu130", ["a:cpu"], None, None), 2, "--torch"),
        ((None, ["a:cpu"], None, None), 2, "--torch"),
        (("2.13.0", [], None, None), 2, "at least one node"),
        (("2.13.0", ["a:cpu", "a:cpu"], None, None), 2, "given twice"),
        (("2.13.0", ["a:driver=470.82.01,gpu=7.0"], None, None), 1, "Fix: upgrade its driver"),
        (("3.0", ["a:cpu"], None, None), 1, "not in the table"),
    ],
)
def test_cli_exit_codes(capsys, args, code, says):
    assert cli(*args, False) == code
    out = capsys.readouterr()
    assert says in (out.out if code == 0 else out.err)
    if code:
        assert out.err.startswith("error: ") and out.err.count("\n") == 1  # one line, no traceback


@pytest.mark.parametrize(
    "loaded, variant",
    [
        (["python/3.11", "cuda/12.6"], "cu126"),
        (["cuda/12.8.1"], "cu128"),
        (["cudatoolkit/12.4"], "cu124"),
        (["cudatoolkit/23.9_11.8"], None),  # Cray's: the HPC SDK's version first, not read
        (["python/3.11"], None),
        (None, None),
    ],
)
def test_the_variant_a_loaded_cuda_module_names(loaded, variant):
    assert torchplan.cuda_variant_of_modules(loaded) == variant


def test_a_loaded_cuda_module_is_preferred_where_it_fits_else_the_rule_stands():
    """An A100 on driver 535 (torch 2.13: cu126, cu128 and cu129 all fit, the rule picks the
    newest): `module load cuda/12.6` makes it cu126; a module asking for a variant 2.13 does not
    publish (cu118) leaves the rule's pick, and the explanation says so."""
    nodes = [parse_node_spec("a100-0:driver=535.104.05,gpus=8x8.0")]
    assert choose("2.13.0", nodes).builds[0].variant == "cu129"
    plan = choose("2.13.0", nodes, prefer="cu126")
    assert plan.builds[0].variant == "cu126"
    assert any("cuda module asks for cu126: it fits" in line for line in plan.explain)
    assert "cu129: fits too; the nodes' cuda module asks for cu126" in plan.builds[0].reasons, plan
    plan = choose("2.13.0", nodes, prefer="cu118")
    assert plan.builds[0].variant == "cu129"
    assert any("the rule's pick stands" in line for line in plan.explain)


def test_torch_plan_is_told_the_fleets_modules_as_provision_reads_them():
    """`invoke torch-plan --module cray-python/3.11.7 --module cuda/12.6`: what provision takes
    from the nodes' MODULES fact, given offline; modules with no CUDA toolkit among them leave
    the rule's pick, and --explain says why."""
    from nodeprep.commands.torch_plan import torch_plan

    node = ("a100-0:driver=535.104.05,gpus=8x8.0",)
    res = torch_plan(
        TorchPlanOptions(torch="2.13.0", nodes=node, modules=("cray-python/3.11.7", "cuda/12.6"))
    )
    assert res.exit_code == 0 and res.plan.builds[0].variant == "cu126"
    res = torch_plan(TorchPlanOptions(torch="2.13.0", nodes=node, modules=("cray-python/3.11.7",)))
    assert res.plan.builds[0].variant == "cu129"
    assert any("no CUDA toolkit module among them" in line for line in res.plan.explain)
