"""DeepSpeed's --include/--exclude strings as --limit (inventory/dsfilter.py), with DeepSpeed's
own runner as the oracle: parse_resource_filter and the functions it calls, taken from the
deepspeed 0.19.8 sdist (PyPI, cached under /tmp), run on the same strings. Then what a launch
makes of the chosen slots, on paper (ops/train/launchplan.py)."""

from __future__ import annotations

import ast
import collections
import copy
import logging
import subprocess
import sys
import tarfile
import typing
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from nodeprep.commands.options import TrainOptions
from nodeprep.commands.train.prepare import plan_of
from nodeprep.engine.facts import FactValues
from nodeprep.errors import InputError
from nodeprep.inventory import dsfilter, load

CACHE = Path("/tmp/nodeprep-deepspeed-sdist")
SDIST = "deepspeed==0.19.8"
RUNNER = "deepspeed-0.19.8/deepspeed/launcher/runner.py"
FUNCTIONS = (
    "_stable_remove_duplicates",
    "parse_node_config",
    "parse_node_config_list",
    "parse_resource_filter",
)


@pytest.fixture(scope="module")
def deepspeed_filter():
    """DeepSpeed's own parse_resource_filter (with what it calls), from its sdist."""
    CACHE.mkdir(exist_ok=True)
    tars = sorted(CACHE.glob("deepspeed-0.19.8.tar.gz"))
    if not tars:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--no-binary",
                ":all:",
                "-d",
                str(CACHE),
                SDIST,
            ],
            check=True,
            timeout=300,
        )
        tars = sorted(CACHE.glob("deepspeed-0.19.8.tar.gz"))
    with tarfile.open(tars[0]) as tar:
        source = tar.extractfile(RUNNER).read().decode()
    tree = ast.parse(source)
    keep = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in FUNCTIONS]
    assert sorted(n.name for n in keep) == sorted(FUNCTIONS)
    ns = {
        "collections": collections,
        "deepcopy": copy.deepcopy,
        "defaultdict": collections.defaultdict,
        "logger": logging.getLogger("deepspeed-oracle"),
        "Tuple": typing.Tuple,
        "List": typing.List,
        "Dict": typing.Dict,
    }
    exec(compile(ast.Module(body=keep, type_ignores=[]), RUNNER, "exec"), ns)
    return ns["parse_resource_filter"]


HOSTS = {"worker-0": 4, "worker-1": 2, "w2": 1}


def oracle(fn, text: str):
    """What DeepSpeed does with TEXT as --include (or, after a leading !, --exclude): its
    hosts and slots, or None where it raises."""
    pool = collections.OrderedDict((h, list(range(k))) for h, k in HOSTS.items())
    try:
        got = fn(pool, exclude_str=text[1:]) if text.startswith("!") else fn(pool, include_str=text)
    except (ValueError, KeyError):
        return None
    return {h: list(s) for h, s in got.items()}


def ours(text: str):
    try:
        return dsfilter.apply(dsfilter.parse(text), HOSTS)
    except InputError:
        return None


CASES = [
    "worker-0@worker-1:0,1",
    "worker-1:1@worker-1:0",
    "worker-1:1,1,0",
    "w2:0",
    "worker-0@worker-0",
    "worker-0:3@w2",
    "!worker-1:0",
    "!worker-0@w2",
    "!w2@worker-1:1",
    "!worker-1:0,1",
    "worker-1:2",
    "worker-9:0",
    "worker-0:",
    "worker-0::1",
    "worker-0:a",
    "@worker-0",
    "worker-0@",
    "!worker-0:0,1,2,3@worker-1@w2",
    "worker-1:-1",
    "worker-1:+1",
    "worker-1: 1",
]


@pytest.mark.slow
@pytest.mark.parametrize("text", CASES)
def test_the_same_answer_as_deepspeeds_runner(deepspeed_filter, text):
    assert dsfilter.is_filter(text)
    assert ours(text) == oracle(deepspeed_filter, text)


_SPEC = st.builds(
    lambda name, slots: name + (":" + ",".join(slots) if slots is not None else ""),
    st.sampled_from(["worker-0", "worker-1", "w2", "worker-7", ""]),
    st.one_of(
        st.none(),
        st.lists(st.sampled_from(["0", "1", "2", "3", "4", "x", ""]), min_size=1, max_size=4),
    ),
)


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(st.booleans(), st.lists(_SPEC, min_size=1, max_size=4))
def test_generated_strings_agree_with_deepspeed(deepspeed_filter, exclude, specs):
    text = ("!" if exclude else "") + "@".join(specs)
    assume(dsfilter.is_filter(text))  # else it is the ordinary --limit grammar
    assert ours(text) == oracle(deepspeed_filter, text)


def test_errors_are_one_line_input_errors():
    for text, says in [
        ("worker-0:a", "slot 'a' on 'worker-0' is not a number"),
        ("worker-0::1", "more than one ':'"),
        ("@worker-0", "without a name"),
    ]:
        with pytest.raises(InputError, match=says):
            dsfilter.parse(text)
    with pytest.raises(InputError, match="worker-1 has no slot 2"):
        dsfilter.apply(dsfilter.parse("worker-1:2"), HOSTS)


# -- the inventory's selection and the launch ------------------------------------------------


@pytest.fixture
def inv(tmp_path):
    p = tmp_path / "hosts.yml"
    p.write_text(
        "vars:\n  user: ops\nhosts:\n"
        "  worker-0: {address: 10.0.0.5}\n  worker-1: {address: 10.0.0.6}\n"
        "  w2: {address: 10.0.0.7}\n"
    )
    return load(str(p))


def test_limit_selects_nodes_in_inventory_order(inv):
    assert [h.name for h in inv.select("w2@worker-0:1")] == ["worker-0", "w2"]
    assert [h.name for h in inv.select("!worker-1")] == [
        "worker-0",
        "w2",
    ]  # no ':': the old grammar
    assert [h.name for h in inv.select("!worker-1@w2:0")] == [
        "worker-0",
        "w2",
    ]  # w2 keeps other slots
    with pytest.raises(InputError, match="node 'worker-9' is not in inventory") as err:
        inv.select("worker-9:0")
    assert "\n" not in str(err.value).split("\nhint")[0]


def _plan(inv, launcher: str, limit: str, gpus: int = 4):
    hosts = inv.select(limit)
    got = {
        h.name: FactValues(
            {
                "gpus": {"count": gpus},
                "user": {"home": "/home/ops"},
                "identity": {"machine": h.name, "home": h.name},
            }
        )
        for h in hosts
    }
    vars_of = {h.name: {n: inv.var(h, n) for n in inv.schema} for h in hosts}
    return plan_of(
        TrainOptions(inventory=None, limit=limit, launcher=launcher, payload="health"),
        "job1",
        hosts,
        got,
        vars_of,
    )[0]


def test_deepspeed_gets_the_chosen_slots_as_its_include(inv):
    plan = _plan(inv, "deepspeed", "worker-0:1,3@worker-1")
    cmd = plan.commands()["worker-0"]
    assert "--include worker-0:1,3@worker-1:0,1,2,3" in cmd
    assert "worker-0 slots=4\nworker-1 slots=4" in cmd  # the hostfile: whole nodes
    assert plan.layout() == [["worker-0", 2], ["worker-1", 4]]


def test_torchrun_gets_visible_devices_and_needs_equal_counts(inv):
    plan = _plan(inv, "torchrun", "worker-0:1,3@worker-1:0,2")
    cmds = plan.commands()
    assert (
        "export CUDA_VISIBLE_DEVICES=1,3; " in cmds["worker-0"]
        and "--nproc-per-node=2" in cmds["worker-0"]
    )
    assert "export CUDA_VISIBLE_DEVICES=0,2; " in cmds["worker-1"]
    with pytest.raises(
        InputError, match="same number of processes on every node.*worker-0 gets 2, worker-1 gets 4"
    ):
        _plan(inv, "torchrun", "worker-0:1,3@worker-1").commands()


def test_an_exclude_that_takes_every_slot_drops_the_node(inv):
    plan = _plan(inv, "deepspeed", "!worker-1:0,1,2,3@w2:0")
    assert [n.name for n in plan.nodes] == ["worker-0", "w2"]
    assert "--include worker-0:0,1,2,3@w2:1,2,3" in plan.commands()["worker-0"]


def test_mpirun_and_srun_refuse_chosen_slots(inv):
    for launcher in ("mpirun", "srun"):
        with pytest.raises(InputError, match=f"{launcher} cannot run on chosen slots of worker-0"):
            _plan(inv, launcher, "worker-0:0,1@worker-1").commands()
    assert (
        "-H worker-0:4,worker-1:4"
        in _plan(inv, "mpirun", "worker-0@worker-1").commands()["worker-0"]
    )
