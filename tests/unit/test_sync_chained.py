"""ops/sync/chained.chains as data: which homes share one chain (the same job directory, files,
deletions and record; enough bytes and nodes to be worth the logins) and which do not."""

from __future__ import annotations

from nodeprep.ops.sync import chained, manifest, push


def _look(send=("a",), delete=(), nbytes=chained.MIN_BYTES, job="/j", record=None) -> push.Look:
    plan = manifest.Plan(list(send), list(delete), [], record or {p: (1, 1, "s") for p in send})
    out = push.Pushed(list(send), list(delete))
    out.nbytes = nbytes
    return push.Look(job, plan, {}, out)


def test_homes_that_would_get_the_same_share_one_chain_in_order():
    looks = {n: _look() for n in ("w2", "w0", "w1", "w3")}
    (c,) = chained.chains(looks, ["w0", "w1", "w2", "w3"])
    assert c.nodes == ["w0", "w1", "w2", "w3"] and c.look is looks["w0"]


def test_different_plans_small_syncs_and_too_few_nodes_get_none():
    looks = {"w0": _look(), "w1": _look(), "w2": _look(send=("b",)), "w3": _look(nbytes=10)}
    assert chained.chains(looks, ["w0", "w1", "w2", "w3"]) == []  # two alike: not worth it
    looks = {n: _look(job=f"/j{n}") for n in ("w0", "w1", "w2")}  # three job directories
    assert chained.chains(looks, ["w0", "w1", "w2"]) == []
    idle = _look(send=(), record={})
    assert idle.idle and chained.chains({n: idle for n in "abc"}, list("abc")) == []


def test_a_node_with_deletions_of_its_own_is_left_to_its_own_stream():
    looks = {n: _look() for n in ("w0", "w1", "w2")}
    looks["w3"] = _look(delete=("old",))
    (c,) = chained.chains(looks, ["w0", "w1", "w2", "w3"])
    assert c.nodes == ["w0", "w1", "w2"]
