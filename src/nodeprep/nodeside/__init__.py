"""Every program nodeprep runs ON the nodes, in one place. Standard library only (the training
payloads also import torch: they run in the nodes' provisioned venv), no nodeprep import:
nodeprep is not installed on the nodes. The controller never imports these modules; it ships
them as files (train: the agent and the payloads) or as text (the probe and the relay hop),
by the paths below. tests/unit/test_architecture.py enforces both rules.

  rank.py        the rank wrapper every launcher starts around the payload: records how the
                 rank ends, dumps its stack on request
  watch.py       one per machine: reports the ranks' starts, exits and output to the controller
  relay_hop.py   one hop of the wheel relay: store the stream, pass it on, hash it
  syncrecv.py    the receiving end of a project sync: files put in place whole, the record
  stage.py       data staging where the source is: its files' chunk sums, the stream
  stagerecv.py   data staging on each node it fills: the stream received (chunks checked as
                 they land, resumable), what the destination holds
  nccl_probe.py  which libnccl a process has mapped and its version (inside the torch probe,
                 and beside the health payload)
  bwpair.py      one node's part of a bandwidth round: listen, send to the peer, time it
  iperf3pair.sh  the same round's part with iperf3, where every node has it
  gpudeep.py     health --deep on one node: the GPU burn and the all_reduce over its GPUs
  gpu_standin.py the lab's stand-in nvidia-smi (and dmesg): answers from a real machine's
                 recording (lab.up --gpu-record)
  payloads/      the builtin training payloads: health, ddp, allreduce
"""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent

BUILTIN: dict[str, Path] = {
    "health": _HERE / "payloads" / "health.py",  # init + all_reduce + barrier, one line per rank
    "ddp": _HERE / "payloads" / "ddp.py",  # tiny DDP trainer with snapshot/resume and failure knobs
    "allreduce": _HERE / "payloads" / "allreduce.py",  # all_reduce bus bandwidth per message size
}

# The job agent (not payloads): every launcher starts RANK around the payload, and one WATCH
# per machine reports the ranks' starts, exits and output to the controller.
RANK = _HERE / "rank.py"
WATCH = _HERE / "watch.py"
RELAY_HOP = _HERE / "relay_hop.py"
SYNCRECV = _HERE / "syncrecv.py"
STAGE = _HERE / "stage.py"
STAGERECV = _HERE / "stagerecv.py"
NCCL_PROBE = _HERE / "nccl_probe.py"
GPU_STANDIN = _HERE / "gpu_standin.py"
BWPAIR = _HERE / "bwpair.py"
GPUDEEP = _HERE / "gpudeep.py"
IPERF3PAIR = _HERE / "iperf3pair.sh"

# What a builtin payload needs beside it in the job directory (it imports them by name).
COMPANIONS: dict[str, list[Path]] = {"health": [NCCL_PROBE]}


def path(name: str) -> Path:
    """The script file of the builtin payload NAME; KeyError if there is none."""
    return BUILTIN[name]
