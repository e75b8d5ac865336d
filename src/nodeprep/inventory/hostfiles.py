"""Host lists that launchers and schedulers write: hostfiles, nodefiles and Slurm lists.

- DeepSpeed and Open MPI/PRRTE hostfiles: `HOST [slots=N] [max_slots=M]` per line, `#`
  comments; Open MPI also spells slots `count=`/`cpu=`, max_slots `max-slots=`/`maxslots=`,
  and takes `user=`/`username=` and `port=`. A host without slots gets the GPU count.
- MPICH/Hydra hostfiles: `HOST:N` (N processes) or `HOST`.
- PBS/Torque nodefiles: one name per line, repeated once per CPU core. The repeats are kept
  as `cpu_slots`; a launcher still runs one process per GPU unless the inventory sets slots.
- Slurm node lists: `gpu[01-04,07],rack[1-2]-n[1-8]` (SLURM_JOB_NODELIST).

A plain file (no .yml/.yaml/.json/.ini extension, not a YAML mapping) is told apart by
content, in this order (sniff):
  1. a `[section]` line, or a host line with a NAME=VALUE that no hostfile knows: Ansible INI;
  2. a line with slots=, max_slots=, user= or port= (or their spellings): a DeepSpeed/Open
     MPI hostfile;
  3. a `HOST:N` line (and bare names): an MPICH/Hydra machinefile, N processes on HOST, as
     mpiexec reads it (a name with ':' is never a host; Ansible's `host:port` lines need an
     .ini file or `ini:PATH`);
  4. only bare names: a nodefile (PBS/Torque; Ansible INI would read the same hosts).
"""

from __future__ import annotations

import re
from pathlib import Path

from nodeprep.errors import InputError
from nodeprep.inventory import nodeset
from nodeprep.inventory.ini import read_text
from nodeprep.inventory.sources import Schema, Source, check_var
from nodeprep.inventory.yamlfile import shown_path

_SLOTS = {"slots", "count", "cpu", "cpus"}
_MAX_SLOTS = {"max_slots", "max-slots", "maxslots", "max_count", "max-count"}
_USER = {"user", "username", "user_name", "user-name"}
HOSTFILE_KEYS = _SLOTS | _MAX_SLOTS | _USER | {"port"}
_MPICH = re.compile(r"^([^\s:=]+):(\d+)$")
_NAME = re.compile(r"^[^\s=:\[\]]+$")


def _lines(path: Path):
    for number, raw in enumerate(read_text(path), 1):
        line = raw.split("#", 1)[0].strip()
        if line:
            yield number, line


def sniff(path: Path) -> str:
    """ini, hostfile or nodefile (InputError for an ambiguous or empty file; yaml for one
    that looks like broken YAML); see above."""
    file, kinds = shown_path(path), {}
    for number, line in _lines(path):
        kinds.setdefault("any", number)
        tokens = line.split()
        if line.startswith("["):
            return "ini"
        if line.endswith(":") or ": " in line or line.startswith("- "):
            return "yaml"
        keys = {t.partition("=")[0] for t in tokens[1:]}
        if any("=" not in t for t in tokens[1:]) or (keys - HOSTFILE_KEYS):
            return "ini"
        if keys:
            kinds.setdefault("hostfile", number)
        elif len(tokens) == 1 and _MPICH.match(line):
            kinds.setdefault("colon", number)
    if "hostfile" in kinds or "colon" in kinds:
        return "hostfile"
    if "any" not in kinds:
        raise InputError("no hosts in the file", "add one host per line", file)
    return "nodefile"


def read_hostfile(src: Source, path: Path, schema: Schema):
    """DeepSpeed, Open MPI/PRRTE and MPICH hostfiles (see the module docstring)."""
    src.kind = "hostfile"
    file = shown_path(path)
    for number, text in _lines(path):
        head, *tokens = text.split()
        entry = {}
        mpich = _MPICH.match(head)
        if mpich and not tokens:
            head, entry["slots"] = mpich.group(1), mpich.group(2)
        for token in tokens:
            key, eq, value = token.partition("=")
            if not eq or key not in HOSTFILE_KEYS:
                raise InputError(
                    f"not a hostfile line: '{text}'",
                    "write `HOST slots=N` (DeepSpeed, Open MPI) or `HOST:N` (MPICH)",
                    file,
                    number,
                )
            if key in _SLOTS:
                entry["slots"] = value
            elif key in _USER:
                entry["user"] = value
            elif key == "port":
                entry["port"] = value
        if "@" in head:
            entry.setdefault("user", head.split("@", 1)[0])
            head = head.split("@", 1)[1]
        if not _NAME.match(head):
            raise InputError(f"not a host name: '{head}'", "write one host per line", file, number)
        if head in src.hosts:
            raise InputError(
                f"host '{head}' is listed twice (first at {src.hosts[head]})",
                "list each host once",
                file,
                number,
            )
        src.hosts[head] = f"{file}:{number}"
        src.entry_vars[head] = {}
        for key, value in entry.items():
            name, checked = check_var(key, value, schema, file, number)
            src.entry_vars[head][name] = (checked, f"{file}:{number}")
    if not src.hosts:
        raise InputError("no hosts in the hostfile", "add lines like `worker-1 slots=8`", file)


def read_nodefile(src: Source, path: Path, schema: Schema):
    """PBS/Torque nodefile: a name per CPU slot; the count becomes cpu_slots."""
    src.kind = "nodefile"
    file = shown_path(path)
    for number, text in _lines(path):
        if len(text.split()) != 1 or not _NAME.match(text):
            raise InputError(
                f"not a nodefile line: '{text}'",
                "write one host name per line, repeated once per CPU slot",
                file,
                number,
            )
        src.hosts.setdefault(text, f"{file}:{number}")
        count = src.entry_vars.setdefault(text, {}).get("cpu_slots", (0, ""))[0] + 1
        src.entry_vars[text]["cpu_slots"] = (count, src.hosts[text])
    if not src.hosts:
        raise InputError("no hosts in the nodefile", "is $PBS_NODEFILE the right file?", file)


def read_slurm(src: Source, nodelist: str):
    src.kind = "slurm"
    try:
        names = nodeset.split_list(nodelist)
    except ValueError as exc:
        raise InputError(
            f"bad Slurm node list '{nodelist}': {exc}", "it looks like gpu[01-04,07],cpu1"
        ) from None
    for name in names:
        if name in src.hosts:
            raise InputError(
                f"host '{name}' is listed twice in the Slurm node list '{nodelist}'",
                "list each host once",
            )
        src.hosts[name] = "slurm"
    if not src.hosts:
        raise InputError("the Slurm node list is empty", "is this a Slurm allocation?")
