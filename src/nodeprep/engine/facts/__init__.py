"""Facts by domain, each an object the code names directly (see probe.py for the machinery):

  system.py  HOSTNAME OS USER LOGIN_SHELL ETC_SHELLS PYTHON PYTHON_ON_PATH DISK_FREE IDENTITY
             ROOM(path): space, inodes, writable where a path is or would be
  net.py     INTERFACES PORT_LISTENING(port) ROUTE(address)
  gpus.py    GPUS
  gpuhealth.py  GPU_DETAIL (nvidia-smi -q -x, nvlink -s) FABRIC
  kernellog.py  KERNEL_LOG (the kernel log's GPU lines: Xids, a GPU off the bus, ...)
  nodehealth.py LIMITS CLOCK RDMA_PORTS NET_LINKS
  gpudeep.py DCGM_DIAG(DcgmIn(level)) GPU_DEEP(DeepIn(venv, ...)): the deep health tier
  files.py   FILE(path) DIR(path) ELF_ARCH(path) STAMP(path)
  python.py  VENV(path) TORCH_BUILD(TorchIn(venv, deep)) IMAGE_STACK(image_id): the Python
             stack inside a container image (its python3, distributions, torch)
  access.py  SUDO((shell, user)) LOGIN_FINDS(programs): what doctor asks of a first contact
  jobs.py    JOB_PROCESSES GPU_APPS PROGRAMS (and JOB_VAR, the job id every job process carries)
  container.py  CONTAINER(engines): podman/docker, may the user run them, their images, the
             GPU toolkit
  modules.py MODULES: the module system, each named module's load, what the modules set;
             RANK_MODULES: what a non-interactive ssh shell has loaded

A new fact: a snippet and a parser in the module of its domain, a data-file case per real
output format under tests/facts/<name>/, and a line in ALL below."""

from __future__ import annotations

from nodeprep.engine.facts.access import LOGIN_FINDS, SUDO
from nodeprep.engine.facts.container import CONTAINER
from nodeprep.engine.facts.files import DIR, ELF_ARCH, FILE, STAMP
from nodeprep.engine.facts.gpudeep import DCGM_DIAG, GPU_DEEP
from nodeprep.engine.facts.gpuhealth import FABRIC, GPU_DETAIL
from nodeprep.engine.facts.gpus import GPUS
from nodeprep.engine.facts.jobs import GPU_APPS, JOB_PROCESSES, JOB_VAR, PROGRAMS
from nodeprep.engine.facts.kernellog import KERNEL_LOG
from nodeprep.engine.facts.modules import MODULES, RANK_MODULES
from nodeprep.engine.facts.net import INTERFACES, PORT_LISTENING, ROUTE, primary_address, reaching
from nodeprep.engine.facts.nodehealth import CLOCK, LIMITS, NET_LINKS, RDMA_PORTS
from nodeprep.engine.facts.probe import (
    Fact,
    FactValues,
    Request,
    gather,
    key_of,
    parse_sections,
    probe_script,
    section_tags,
    split_sections,
)
from nodeprep.engine.facts.python import IMAGE_STACK, TORCH_BUILD, VENV, TorchIn
from nodeprep.engine.facts.system import (
    DISK_FREE,
    ETC_SHELLS,
    HOSTNAME,
    IDENTITY,
    LOGIN_SHELL,
    OS,
    PYTHON,
    PYTHON_ON_PATH,
    ROOM,
    USER,
)

# Every fact, by name: for the data-file tests and for messages, never for lookups at run time.
ALL = {
    f.name: f
    for f in (
        RANK_MODULES,
        MODULES,
        HOSTNAME,
        OS,
        USER,
        LOGIN_SHELL,
        ETC_SHELLS,
        PYTHON,
        PYTHON_ON_PATH,
        DISK_FREE,
        IDENTITY,
        INTERFACES,
        PORT_LISTENING,
        ROUTE,
        GPUS,
        FILE,
        DIR,
        ELF_ARCH,
        STAMP,
        VENV,
        TORCH_BUILD,
        IMAGE_STACK,
        JOB_PROCESSES,
        GPU_APPS,
        PROGRAMS,
        ROOM,
        GPU_DETAIL,
        KERNEL_LOG,
        FABRIC,
        LIMITS,
        CLOCK,
        RDMA_PORTS,
        NET_LINKS,
        DCGM_DIAG,
        GPU_DEEP,
        SUDO,
        LOGIN_FINDS,
        CONTAINER,
    )
}

# What `invoke facts` shows.
NODE_FACTS = [HOSTNAME, OS, INTERFACES, PYTHON, LOGIN_SHELL, DISK_FREE, GPUS]

__all__ = [
    "ALL",
    "NODE_FACTS",
    "Fact",
    "FactValues",
    "Request",
    "TorchIn",
    "gather",
    "key_of",
    "parse_sections",
    "primary_address",
    "probe_script",
    "reaching",
    "ROUTE",
    "section_tags",
    "split_sections",
    "DIR",
    "ELF_ARCH",
    "FILE",
    "STAMP",
    "GPUS",
    "INTERFACES",
    "PORT_LISTENING",
    "TORCH_BUILD",
    "IMAGE_STACK",
    "VENV",
    "DISK_FREE",
    "ETC_SHELLS",
    "HOSTNAME",
    "IDENTITY",
    "LOGIN_SHELL",
    "OS",
    "PYTHON",
    "PYTHON_ON_PATH",
    "ROOM",
    "USER",
    "GPU_APPS",
    "JOB_PROCESSES",
    "JOB_VAR",
    "PROGRAMS",
    "GPU_DETAIL",
    "KERNEL_LOG",
    "FABRIC",
    "LIMITS",
    "CLOCK",
    "RDMA_PORTS",
    "NET_LINKS",
    "DCGM_DIAG",
    "GPU_DEEP",
    "SUDO",
    "LOGIN_FINDS",
    "CONTAINER",
    "MODULES",
    "RANK_MODULES",
]
