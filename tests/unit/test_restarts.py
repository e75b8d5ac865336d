"""What `train --restarts` does after a failed attempt (ops/train/restarts.py), and the nodes it
quarantines (ops/train/quarantine.py): decisions as data, the store on a real file."""

from __future__ import annotations

import pytest

from nodeprep.errors import InputError, NodeprepError
from nodeprep.ops.train import quarantine, restarts
from nodeprep.ops.train.causes import RETRIED, Cause

NODES = ["worker-0", "worker-1", "worker-2"]
LOST = Cause("node", "worker-2", "worker-2 stopped answering (silent 8 s)")


def test_a_lost_node_is_quarantined_and_the_job_goes_on_without_it_when_allowed():
    d = restarts.decide(LOST, 1, NODES, restarts.Policy(2, 2))
    assert d.relaunch and d.nodes == ["worker-0", "worker-1"]
    assert list(d.quarantine) == ["worker-2"] and "a node lost" in d.quarantine["worker-2"]
    # without --min-nodes the job needs all three: it stops, naming the node and why
    d = restarts.decide(LOST, 1, NODES, restarts.Policy(2, 3))
    assert not d.relaunch and d.quarantine == {"worker-2": LOST.line}
    assert d.why.startswith("2 node(s) left, --min-nodes 3: worker-2: node on worker-2"), d.why


def test_the_users_error_is_not_retried_unless_asked_and_ctrl_c_never():
    user = Cause("user", None, "worker-1 r1 exited with status 1: ValueError: bad")
    d = restarts.decide(user, 1, NODES, restarts.Policy(3, 3))
    assert not d.relaunch and d.why == "user is not retried (--retry-on user retries it)"
    d = restarts.decide(user, 1, NODES, restarts.Policy(3, 3, RETRIED | {"user"}))
    assert d.relaunch and d.nodes == NODES and d.quarantine == {}  # nobody blamed
    stop = Cause("interrupted", None, "Ctrl-C")
    d = restarts.decide(stop, 1, NODES, restarts.Policy(3, 1, frozenset({"interrupted"})))
    assert not d.relaunch and d.why == "interrupted is not retried"


def test_the_budget_is_the_whole_jobs():
    hang = Cause("hang", None, "no rank wrote output for 10s")
    assert restarts.decide(hang, 2, NODES, restarts.Policy(2, 3)).relaunch
    d = restarts.decide(hang, 3, NODES, restarts.Policy(2, 3))
    assert not d.relaunch and d.why == "the restart budget of 2 is used up (3 attempts)"
    assert restarts.decide(None, 1, NODES, restarts.Policy(2, 3)).why == "finished"


def test_backoff_doubles_up_to_its_cap():
    assert [restarts.backoff(k) for k in (2, 3, 4, 5)] == [1.0, 2.0, 4.0, 8.0]
    assert restarts.backoff(20) == restarts.BACKOFF_MAX


def test_quarantine_is_kept_listed_and_released(tmp_path):
    assert quarantine.load(tmp_path) == {}
    quarantine.add(tmp_path, "worker-2", "node on worker-2 (a node lost)", "J1", now=0.0)
    quarantine.add(tmp_path, "worker-3", "left out by the health gate", "J2", now=60.0)
    held = quarantine.load(tmp_path)
    assert set(held) == {"worker-2", "worker-3"} and held["worker-2"]["job"] == "J1"
    assert "worker-2 quarantined since " in quarantine.line("worker-2", held["worker-2"])
    assert quarantine.release(tmp_path, ["worker-2", "worker-9"]) == (["worker-2"], ["worker-9"])
    assert list(quarantine.load(tmp_path)) == ["worker-3"]
    assert quarantine.release(tmp_path, ["*"]) == (["worker-3"], [])
    assert quarantine.load(tmp_path) == {}
    quarantine.path_of(tmp_path).write_text("{not json")
    with pytest.raises(NodeprepError, match="quarantine.json: unreadable"):
        quarantine.load(tmp_path)  # never every node back in service by accident


def test_a_spare_takes_each_lost_nodes_place_and_counts_toward_min_nodes():
    d = restarts.decide(LOST, 1, NODES, restarts.Policy(2, 3), ("spare-0", "spare-1"))
    assert d.relaunch and d.nodes == ["worker-0", "worker-1"] and d.take == ["spare-0"]
    d = restarts.decide(LOST, 1, NODES, restarts.Policy(2, 3), ())
    assert not d.relaunch and d.take == []  # no spare: too few without --min-nodes


def test_settle_counts_the_spares_that_joined_and_names_what_is_missing():
    d = restarts.decide(LOST, 1, NODES, restarts.Policy(2, 3), ("spare-0",))
    gone = {"worker-2": LOST.line, "spare-0": "spare: provision failed: exit 1"}
    restarts.settle(d, [], gone, restarts.Policy(2, 3))
    assert not d.relaunch and "spare-0: spare: provision failed" in d.why, d.why
    d = restarts.decide(LOST, 1, NODES, restarts.Policy(2, 3), ("spare-0",))
    restarts.settle(d, ["spare-0"], {"worker-2": LOST.line}, restarts.Policy(2, 3))
    assert d.relaunch and d.nodes == ["worker-0", "worker-1", "spare-0"]


# -- the inventory's train_* variables (commands/train/jobvars.py) --------------------------------
def _job(tmp_path, text: str, **flags):
    from nodeprep.commands.options import TrainOptions
    from nodeprep.commands.train import jobvars
    from nodeprep.inventory import model as inventory
    from nodeprep.inventory.schema import load_schema
    from nodeprep.settings import find_project

    (tmp_path / "hosts.yml").write_text(text)
    inv = inventory.load(str(tmp_path / "hosts.yml"), schema=load_schema([find_project()]))
    return jobvars.apply(TrainOptions(inventory="x", **flags), inv, inv.hosts)


HOSTS = """\
vars:
  train_restarts: 2
  train_retry_on: [node, user]
  train_resume_args: [--resume, --from, last]
hosts:
  a: {address: 10.0.0.1}
  b: {address: 10.0.0.2, train_min_nodes: %s}
"""


def test_the_inventory_gives_what_the_flags_leave_out(tmp_path):
    opts = _job(tmp_path, HOSTS % "null")
    assert (opts.restarts, opts.retry_on, opts.min_nodes) == (2, ("node", "user"), None)
    assert opts.resume_args == ("--resume", "--from", "last")
    # a flag wins, 0 included
    opts = _job(tmp_path, HOSTS % "null", restarts=0, retry_on=("hang",), resume_args=("-r",))
    assert (opts.restarts, opts.retry_on, opts.resume_args) == (0, ("hang",), ("-r",))
    assert _job(tmp_path, "hosts: {a: {address: 10.0.0.1}}").restarts == 0  # the default


def test_nodes_of_one_job_that_disagree_are_refused_with_both_values(tmp_path):
    with pytest.raises(InputError) as e:
        _job(tmp_path, HOSTS % "1")
    msg = e.value.message
    assert "train_min_nodes: a has null (the default, " in msg, msg
    assert "b has 1 (" in msg and "hosts.yml:7)" in msg, msg
    assert _job(tmp_path, HOSTS % "1", min_nodes=2).min_nodes == 2  # the flag settles it


@pytest.mark.parametrize(
    "line,said",
    [
        ("train_retry_on: [interrupted]", "hosts.yml:2: train_retry_on: 'interrupted' is not a"),
        ("train_retry_on: [nod]", "hosts.yml:2: train_retry_on: 'nod' is not a failure class"),
        ("train_resume_args: [1]", "hosts.yml:2: train_resume_args: 1 is not a word"),
        ("train_restarts: -1", "train_restarts must be 0 or more, got -1"),
        ("train_min_nodes: 0", "train_min_nodes must be 1 or more, got 0"),
        ("train_retry_on: node", "hosts.yml:2: variable 'train_retry_on': expected a list"),
    ],
)
def test_a_bad_train_variable_names_its_line(tmp_path, line, said):
    with pytest.raises(InputError) as e:
        _job(tmp_path, f"vars:\n  {line}\nhosts:\n  a: {{address: 10.0.0.1}}\n")
    assert said in e.value.message, e.value.message
