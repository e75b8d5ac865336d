"""`invoke bandwidth` on the lab: every node sends and receives at once, over the lab's real
veths; a node whose link tc limits to 50 Mbit/s both ways is named, in full and quick mode,
with iperf3 (requirements/bootstrap.sh installs it; the nodes see the host's /usr) and with the
builtin sender, and no other node is."""
from __future__ import annotations

import json

import pytest

from nodeprep import cli as api
from nodeprep import lab as labmod
from nodeprep.commands.options import BandwidthOptions


@pytest.fixture
def slow_worker_2(lab):
    labmod.limit_link(lab, 2, "50mbit")
    yield
    labmod.limit_link(lab, 2, None)


def _run(lab, settings, capsys, **kw) -> tuple[int, dict]:
    code = api.bandwidth(BandwidthOptions(str(lab.inventory), json=True, seconds=1.0, **kw), settings)
    return code, json.loads(capsys.readouterr().out)


def _slow_and_fast(rep):
    slow = [v for k, v in rep["gbps"].items() if "worker-2" in k]
    fast = [v for k, v in rep["gbps"].items() if "worker-2" not in k]
    assert max(slow) < 0.06 and min(fast) > 5 * max(slow), rep       # tc's 50 Mbit/s, the others far above


@pytest.mark.parametrize("tool", ["iperf3", "builtin"])
def test_the_slow_node_is_named_full(lab, lab_settings, capsys, slow_worker_2, tool):
    code, rep = _run(lab, lab_settings, capsys, tool=tool)
    assert code == 1 and list(rep["flagged"]) == ["worker-2"] and rep["tool"] == tool, rep
    assert rep["rounds"] == 2 and len(rep["gbps"]) == 6                   # 3 nodes: every ordered pair
    _slow_and_fast(rep)


def test_the_slow_node_is_named_quick(lab, lab_up, lab_settings, capsys, slow_worker_2):
    """4 nodes: the matching pairs worker-0/2 and worker-1/3; worker-0 and worker-2 are suspects,
    each then tested against a good node; worker-0 passes, worker-2 does not."""
    lab_up(4)
    try:
        code, rep = _run(lab, lab_settings, capsys, quick=True)
    finally:
        lab_up()
    assert code == 1 and list(rep["flagged"]) == ["worker-2"] and rep["mode"] == "quick", rep
    assert rep["tool"] == "iperf3", rep                                   # auto: every node has it
    assert rep["rounds"] == 2 and len(rep["gbps"]) == 8, rep              # 4 matched flows + 4 second-pass
    _slow_and_fast(rep)


@pytest.mark.parametrize("tool", ["iperf3", "builtin"])
def test_a_healthy_lab_names_no_node_and_gives_latency(lab, lab_settings, capsys, tmp_path, tool):
    code, rep = _run(lab, lab_settings, capsys, tool=tool)
    assert code == 0 and rep["flagged"] == {} and rep["errors"] == {}, rep
    assert len(rep["rtt_ms"]) == 6 and all(0 < v < 50 for v in rep["rtt_ms"].values()), rep
    assert api.bandwidth(BandwidthOptions(str(lab.inventory), limit="worker-0"), lab_settings) == 2
