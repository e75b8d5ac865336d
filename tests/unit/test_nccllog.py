"""NCCL's own log, as `verify-parity --collective` reads it (ops/verify/nccllog.py): real excerpts
of NCCL 2.4 to 2.29 with and without a net plugin in tests/facts/nccl_log/ (each names its source
thread and the answer expected), the ranks' lines as the supervisor hands them (node, rank), and the
table the collective prints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nodeprep.cli import render
from nodeprep.commands import collective
from nodeprep.ops.verify import nccllog

LOGS = sorted((Path(__file__).parents[1] / "facts" / "nccl_log").glob("*.log"))


def case(path: Path) -> tuple[list[str], dict]:
    lines = path.read_text().splitlines()
    assert lines[0].startswith("# source: https://"), f"{path.name} names no source"
    expect = json.loads(
        next(ln for ln in lines if ln.startswith("# expect: "))[len("# expect: ") :]
    )
    return [ln for ln in lines if not ln.startswith("#")], expect


@pytest.mark.parametrize("path", LOGS, ids=[p.stem for p in LOGS])
def test_real_logs(path):
    lines, expect = case(path)
    assert lines and expect
    assert nccllog.parse(lines) == expect


def test_the_corpus_covers_plugin_loaded_and_not():
    said = [nccllog.parse(case(p)[0]) for p in LOGS]
    plugins = {s.get("net_plugin") for s in said}
    assert "none" in plugins and any(p and p.startswith("aws-ofi-nccl 1.") for p in plugins)
    assert any(p and "initialization failed" in p for p in plugins)
    assert {"IB", "Socket", "Libfabric", "AWS Libfabric", "IBext"} <= {
        s.get("network") for s in said
    }
    assert len({s["version"] for s in said if "version" in s}) >= 7


@pytest.mark.parametrize(
    "via,kind",
    [
        ("P2P/IPC/read", "P2P/IPC"),
        ("P2P/CUMEM", "P2P/CUMEM"),
        ("P2P/direct pointer/read", "P2P/direct pointer"),
        ("SHM/direct/direct", "SHM"),
        ("NET/IB/0/GDRDMA", "NET/IB/GDRDMA"),
        ("NET/IB/3", "NET/IB"),
        ("NET/Socket/0", "NET/Socket"),
        ("NET/AWS Libfabric/1(2)/GDRDMA/Shared", "NET/AWS Libfabric/GDRDMA"),
    ],
)
def test_transport_names(via, kind):
    assert nccllog.transport(via) == kind


def test_lines_without_nccl_say_nothing():
    # gloo: the allreduce payload's own lines, torchrun's, a Python warning
    assert (
        nccllog.parse(
            [
                "allreduce:       1024 B       120.5 us  algbw 0.008 GB/s",
                "WARNING:torch.distributed.run: Setting OMP_NUM_THREADS",
                "",
            ]
        )
        == {}
    )


def as_ranks(node: str, rank: int, lines: list[str]) -> list[tuple[str, str]]:
    """Lines as the supervisor passes them on: prefixed by node and rank ("worker-1 r3")."""
    return [(f"{node} r{rank}", ln) for ln in lines]


def test_by_node_splits_what_each_node_said():
    ofi, _ = case(next(p for p in LOGS if "aws_ofi_nccl_1.16.2" in p.name))
    none, _ = case(next(p for p in LOGS if "2.21.5" in p.name))
    seen = (
        as_ranks("gpu-0", 0, ofi)
        + as_ranks("gpu-1", 1, none)
        + [("gpu-1", "torchrun: launcher line"), ("cpu-0 r2", "allreduce: OK world_size=3")]
    )
    got = collective.by_node(seen)
    assert set(got) == {"gpu-0", "gpu-1"}  # cpu-0's rank logged no NCCL: left out
    assert (
        got["gpu-0"]["net_plugin"] == "aws-ofi-nccl 1.16.2"
        and got["gpu-0"]["network"] == "Libfabric"
    )
    assert got["gpu-1"] == {"net_plugin": "none", "network": "Socket", "version": "2.21.5"}


def test_collective_table_shows_what_nccl_said():
    res = {
        "launcher": "torchrun",
        "ok": True,
        "world_size": 2,
        "backend": "nccl",
        "sizes": [],
        "nccl": {
            "gpu-0": {
                "net_plugin": "none",
                "network": "IB",
                "transport": "NET/IB/GDRDMA",
                "version": "2.21.5",
            },
            "gpu-1": {"net_plugin": "none", "network": "IB", "transport": "NET/IB/GDRDMA"},
        },
    }
    text = render.collective(res)
    assert (
        "  NCCL on gpu-[0-1]: net plugin none, network IB, transport NET/IB/GDRDMA"
        in text.splitlines()
    )
    assert text.splitlines()[-1] == "  NCCL version (rank 0's log): 2.21.5"
    gloo = render.collective({**res, "backend": "gloo", "nccl": None})
    assert "NCCL" not in gloo


def test_nccl_info_lines_stay_off_the_screen_but_are_kept():
    shown = []

    class Inner:
        def line(self, node, text):
            shown.append(text)

    lines = collective._Lines(Inner())
    lines.line("gpu-0 r0", "gpu-0:188:585 [0] NCCL INFO Using network IB")
    lines.line("gpu-0 r0", "gpu-0:188:585 [0] misc/socket.cc:50 NCCL WARN socket timeout")
    lines.line("gpu-0 r0", "allreduce: OK world_size=2 backend=nccl")
    assert shown == [
        "gpu-0:188:585 [0] misc/socket.cc:50 NCCL WARN socket timeout",
        "allreduce: OK world_size=2 backend=nccl",
    ]
    assert len(lines.seen) == 3 and lines.seen[0][0] == "gpu-0 r0"
