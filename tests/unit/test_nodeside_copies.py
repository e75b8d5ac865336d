"""nodeside/ programs run on nodes without nodeprep installed (standard library only), so a
constant they share with the controller is written twice: once in the package, once in the
program. Each pair must stay equal; the package's copy is the source."""

import ast
import os
import signal

from nodeprep import nodeside
from nodeprep.commands.train import supervise
from nodeprep.engine.facts import jobs
from nodeprep.lab import gpu as labgpu
from nodeprep.nodeside import gpu_standin, rank, relay_hop
from nodeprep.ops.pystack import relay
from nodeprep.ops.train import payload


def _constant(path, name: str):
    """NAME's literal value in the program at PATH (watch.py imports rank.py as a sibling, as
    it runs on a node, so it is read rather than imported)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [
            name
        ]:
            return ast.literal_eval(node.value)
    raise AssertionError(f"{path.name} has no {name}")


def test_the_job_variable_tags_the_same_processes():
    assert rank.JOB_VAR == jobs.JOB_VAR


def test_the_run_directory_on_a_node_is_one_path():
    assert rank.RUNS == payload.NODE_RUNS
    assert rank.run_dir("j1") == os.path.join(os.path.expanduser("~"), payload.NODE_RUNS, "j1")


def test_the_watchers_stop_file_is_one_name():
    assert _constant(nodeside.WATCH, "STOP") == supervise.WATCH_STOP


def test_the_stack_signal_is_the_one_the_supervisor_sends():
    name, _, offset = supervise.STACK_SIGNAL.partition("+")
    assert rank.STACK_SIGNAL == getattr(signal, "SIG" + name) + int(offset or 0)


def test_the_relay_hops_sums_file_is_the_one_the_arrival_check_reads():
    assert relay_hop.SUMS == relay.HOP_SUMS


def test_the_gpu_standin_reads_the_recording_the_lab_writes():
    assert os.path.basename(gpu_standin.HERE) == labgpu.RECORD
