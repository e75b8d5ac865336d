"""ops/stage/needs.py and spec.py as data: each node's files (all, or its shard by rank), what a
node lacks after what it holds, the room that needs, the chains; stage entries of an inventory
and their errors at file:line."""

from __future__ import annotations

import pytest

from nodeprep.commands.options import StageOptions
from nodeprep.errors import InputError
from nodeprep.ops.stage import needs as lack
from nodeprep.ops.stage import spec


def _e(path: str, size: int = 10, sums=("a",)) -> lack.Entry:
    return lack.Entry(path, size, 1, tuple(sums))


def _state(staged=None, parts=None, free=1 << 40) -> lack.State:
    return lack.State(staged or {}, parts or {}, free)


M = lack.Manifest(tuple(_e(f"f{i}") for i in range(7)))


def test_every_node_gets_everything_unless_sharded():
    got = lack.shards(M, ["n0", "n1"], shard=False)
    assert got["n0"] == got["n1"] == list(M.entries)


def test_a_shard_is_every_nth_file_in_path_order_from_the_nodes_rank():
    got = lack.shards(M, ["n0", "n1", "n2"], shard=True)
    assert [e.path for e in got["n0"]] == ["f0", "f3", "f6"]
    assert [e.path for e in got["n1"]] == ["f1", "f4"]
    assert [e.path for e in got["n2"]] == ["f2", "f5"]
    assert sorted(e.path for es in got.values() for e in es) == [e.path for e in M.entries]


def test_a_node_lacks_what_its_record_does_not_vouch_for_and_the_missing_chunks():
    big = _e("big", size=3 * lack.CHUNK, sums=("x", "y", "z"))
    small = _e("small")
    old = _e("old")
    state = _state(
        staged={"small": small.digest, "old": "another version"},
        parts={"big": (big.digest, frozenset({0, 2}))},
    )
    need = lack.needs([big, small, old], state)
    assert [(n.entry.path, n.chunks) for n in need] == [("big", (1,)), ("old", (0,))]
    assert need[0].nbytes == lack.CHUNK


def test_a_part_with_every_chunk_but_not_in_place_gets_its_last_chunk_again():
    big = _e("big", size=2 * lack.CHUNK, sums=("x", "y"))
    need = lack.needs([big], _state(parts={"big": (big.digest, frozenset({0, 1}))}))
    assert [(n.entry.path, n.chunks) for n in need] == [("big", (1,))]


def test_what_verify_found_bad_is_forced_whatever_the_record_says():
    a = _e("a")
    state = lack.State({}, {}, 1 << 40, frozenset({"a"}))
    assert lack.needs([a], state)[0].force
    (c,) = lack.chains({"n0": lack.needs([a], state), "n1": [lack.Need(a, (0,))]},
                       ["n0", "n1"], shard=False, relay=True)  # fmt: skip
    assert c.need[0].force  # the union forces it for the chain


def test_nodes_seeing_one_dest_are_filled_once_with_every_shard_of_theirs():
    from nodeprep.commands.stage import _sharers

    gets = lack.shards(M, ["n0", "n1", "n2"], shard=True)
    states = {
        "n0": lack.State({}, {}, 1, ident="nfs"),
        "n1": lack.State({}, {}, 1, ident="local-1"),
        "n2": lack.State({}, {}, 1, ident="nfs"),
    }
    assert _sharers(["n0", "n1", "n2"], states, gets) == {"n2": "n0"}
    assert [e.path for e in gets["n0"]] == ["f0", "f2", "f3", "f5", "f6"]  # n0's and n2's
    assert [e.path for e in gets["n1"]] == ["f1", "f4"]


def test_a_part_of_another_version_counts_for_nothing():
    big = _e("big", size=2 * lack.CHUNK, sums=("x", "y"))
    need = lack.needs([big], _state(parts={"big": ("stale", frozenset({0, 1}))}))
    assert need[0].chunks == (0, 1)


def test_room_is_what_the_missing_chunks_take_against_the_free_bytes():
    need = lack.needs([_e("a", 600), _e("b", 500)], _state(free=1000))
    assert lack.short_of_room(need, _state(free=1000)) == 100
    assert lack.short_of_room(need, _state(free=1100)) == 0


def test_one_chain_through_every_lacking_node_carries_the_union():
    a, b = _e("a"), _e("b")
    wants = {"n0": [lack.Need(a, (0,))], "n1": [], "n2": [lack.Need(b, (0,))]}
    (c,) = lack.chains(wants, ["n0", "n1", "n2"], shard=False, relay=True)
    assert c.nodes == ["n0", "n2"]
    assert [(n.entry.path, n.chunks) for n in c.need] == [("a", (0,)), ("b", (0,))]


def test_shards_and_no_relay_get_a_stream_each():
    a = _e("a")
    wants = {"n0": [lack.Need(a, (0,))], "n1": [lack.Need(a, (0,))]}
    for shard, relay in ((True, True), (False, False)):
        got = lack.chains(wants, ["n0", "n1"], shard=shard, relay=relay)
        assert [c.nodes for c in got] == [["n0"], ["n1"]]
    assert lack.chains({"n0": []}, ["n0"], shard=False, relay=True) == []


def test_the_request_is_what_send_reads():
    e = _e("a", size=5, sums=("s",))
    assert lack.request([lack.Need(e, (0,))]) == [["a", 5, 1, lack.CHUNK, ["s"], [0], 0o644, False]]


def test_inventory_stages_resolve_relative_to_the_inventory_file(tmp_path):
    inv = str(tmp_path / "hosts.yml")
    stages = {"data": {"src": "data", "dest": "~/data", "shard": True}}
    (got,) = spec.from_inventory(stages, ["data"], (inv, 7), {"w0"})
    assert got == spec.Spec("data", str(tmp_path / "data"), "~/data", True, None)
    (node,) = spec.from_inventory(
        {"t": {"src": "/srv/t", "dest": "/scratch/t", "from": "w0"}}, ["t"], (inv, 7), {"w0"}
    )
    assert node.from_node == "w0" and node.title == "t: w0:/srv/t -> /scratch/t"


@pytest.mark.parametrize(
    "stages, names, said",
    [
        ({}, ["data"], "stage 'data' is not in the inventory's stages (it has: none)"),
        ({"d": ["x"]}, ["d"], "stages: d: expected a mapping"),
        ({"d": {"src": "a", "dest": "/b", "size": 1}}, ["d"], "unknown key 'size'"),
        ({"d": {"src": "a"}}, ["d"], "dest is missing"),
        ({"d": {"src": "a", "dest": "rel"}}, ["d"], "must be absolute or start with ~/"),
        ({"d": {"src": "a", "dest": "/b", "shard": "yes"}}, ["d"], "shard: 'yes' is not bool"),
        ({"d": {"src": "a", "dest": "/b", "from": "w9"}}, ["d"], "'w9' is not a node"),
        ("x", ["d"], "stages: expected a mapping of names"),
    ],
)
def test_a_bad_stage_entry_is_named_at_the_inventorys_line(stages, names, said):
    with pytest.raises(InputError) as err:
        spec.from_inventory(stages, names, ("inventory/x/hosts.yml", 12), {"w0"})
    assert said in str(err.value) and str(err.value).startswith("inventory/x/hosts.yml:12: ")


@pytest.mark.parametrize(
    "kw, said",
    [
        ({}, "SRC and DEST are needed"),
        ({"src": "a"}, "SRC and DEST are needed"),
        ({"src": "a", "dest": "rel/x"}, "must be absolute or start with ~/"),
        ({"src": "a", "dest": "/x", "names": ("d",)}, "not both"),
    ],
)
def test_stage_options_refuse_what_cannot_run(kw, said):
    with pytest.raises(InputError) as err:
        StageOptions(**kw).validate()
    assert said in str(err.value) and err.value.exit_code == 2


def test_the_text_says_each_nodes_outcome_and_where_it_came_from():
    from nodeprep.cli.staging import text
    from nodeprep.commands.stage import NodeStage, Staged, StageResult

    st = Staged(spec.Spec("", "data", "~/d"), files=3, nbytes=3_000_000_000, chained=True)
    st.nodes = [
        NodeStage("w0", "staged", 2_000_000_000, 2, via="controller"),
        NodeStage("w1", "failed", 2_000_000_000, 2, via="w0", error="w1: disk full"),
        NodeStage("w2", "unchanged"),
    ]
    st.sent_here, st.seconds = 2_000_000_000, 12.5
    got = text(StageResult([st])).splitlines()
    assert got[0] == "stage data -> ~/d: 3 file(s), 3.0 GB"
    assert got[1].split() == "w0 staged 2.0 GB in 2 file(s) (from controller)".split()
    assert got[2].split() == "w1 failed 2.0 GB in 2 file(s): w1: disk full".split()
    assert got[3].split() == ["w2", "unchanged"]
    assert "1 node(s) filled in 12.5 s, chained node to node" in got[4]
    assert StageResult([st]).exit_code == 1
    st.nodes = [NodeStage("w0", "unchanged")]
    st.verified = True
    assert "nothing to change: every node holds it (every file hashed there)" in text(
        StageResult([st])
    )


def test_progress_is_a_bar_with_bytes_rate_and_time_left_per_node():
    from nodeprep.commands.stage import _Progress
    from nodeprep.engine.events import Events

    class Seen(Events):
        def __init__(self):
            self.said = []

        def status(self, node, stage, status, message=""):
            self.said.append((node, stage, status, message))

    seen = Seen()
    p = _Progress(seen)
    p.total["w1"] = 2 << 30
    p.t0["w1"] = 0.0  # started long ago: some rate, some time left
    p("w1", 3 << 29)
    node, stage, status, message = seen.said[-1]
    assert (node, stage, status) == ("w1", "stage", "running")
    assert message.startswith("[#######...] 1.50 GiB of 2.00 GiB, ") and message.endswith(" s left")
