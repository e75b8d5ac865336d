"""What a sync moves to one node (issue 48), decided from the project's files as they are here
and the node's record of what it got: pure, no I/O but the hash function it is given.

The record (kept on the node beside the files, so a node wiped or new starts empty) maps each
path nodeprep put there to (size, mtime_ns, sha256) of the controller's file it came from.
- a path not in the record is sent;
- a path whose size and mtime match its record is unchanged: its content is not read;
- a path whose size or mtime differ is hashed: the same sha256 keeps the node's copy (the
  record takes the new mtime: `touch` moves nothing), another is sent;
- a path in the record and no longer in the project is deleted on the node. Only those: a file
  the job wrote there (a checkpoint, a log) was never in the record and is never touched.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

Stat = tuple[int, int]  # (size, mtime_ns) of a file here
Entry = tuple[int, int, str]  # (size, mtime_ns, sha256) of what the node got


@dataclass
class Plan:
    send: list[str] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    hashed: list[str] = field(default_factory=list)  # read here because size or mtime changed
    record: dict[str, Entry] = field(default_factory=dict)  # the node's record once it is done

    @property
    def nothing(self) -> bool:
        return not self.send and not self.delete


def plan(local: dict[str, Stat], record: dict[str, Entry], sha_of: Callable[[str], str]) -> Plan:
    """LOCAL: the project's files (path -> Stat); RECORD: what the node says it got; SHA_OF(path):
    the sha256 of a file here, called only for a path whose size or mtime changed or that the
    node has never got (its record entry needs one)."""
    out = Plan()
    for path in sorted(local):
        size, mtime = local[path]
        had = record.get(path)
        if had is not None and (had[0], had[1]) == (size, mtime):
            out.record[path] = had
            continue
        sha = sha_of(path)
        if had is None:
            out.send.append(path)
        else:
            out.hashed.append(path)
            if had[2] != sha or had[0] != size:
                out.send.append(path)
        out.record[path] = (size, mtime, sha)
    out.delete = sorted(p for p in record if p not in local)
    return out
