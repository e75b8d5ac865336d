"""verify --collective: the rank-0 result line as the allreduce payload prints it, and the
rendered table."""

from nodeprep.cli import render
from nodeprep.commands import collective

LINE = (
    'allreduce-json: {"world_size": 2, "backend": "gloo", "ok": true, "sizes": ['
    '{"bytes": 1024, "time_us": 120.5, "algbw_gbps": 0.008, "busbw_gbps": 0.008, "correct": true}]}'
)


def test_parse_finds_rank0_line_on_any_node():
    assert (
        collective.parse(["no result here\n", "x\n" + LINE + "\nallreduce: OK\n"])["world_size"]
        == 2
    )
    assert collective.parse(["nothing\n"]) is None


def test_render_table_and_failure():
    res = {"launcher": "torchrun", **collective.parse([LINE]), "ok": True}
    text = render.collective(res)
    assert text.splitlines()[0] == "collective all_reduce via torchrun: OK (world size 2, gloo)"
    assert "1024" in text and " 0.008 GB/s" in text
    assert (
        render.collective({"launcher": "torchrun", "error": "preflight failed"})
        == "collective all_reduce via torchrun: FAILED: preflight failed"
    )
