"""Xid lines of a kernel log: which GPU, which code, how old, and what the code means
(xids.yml: NVIDIA's table, the hardware codes apart from the application's)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

# `NVRM: Xid (PCI:0000:07:00): 79, pid=..., GPU has fallen off the bus.`
XID_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f:.]+)\):\s*(\d+)\s*,?\s*(.*)")


@dataclass(frozen=True)
class XidEvent:
    code: int
    device: str  # the PCI address the line names
    age: float | None  # seconds ago (None: the log had no stamp)
    text: str


@lru_cache(maxsize=1)
def table() -> dict[int, dict]:
    data = yaml.load(
        Path(__file__).with_name("xids.yml").read_text(),  # our own file
        Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader),
    )
    return {int(k): v for k, v in data.items()}


def events(lines: list[dict]) -> list[XidEvent]:
    """The Xid events among kernel log lines ({age, text}), oldest first."""
    out = []
    for ln in lines:
        m = XID_LINE.search(ln["text"])
        if m:
            out.append(
                XidEvent(int(m.group(2)), m.group(1).lower(), ln.get("age"), m.group(3).strip())
            )
    return out


def describe(code: int) -> dict:
    """{verdict: CRITICAL|WARN|APP|UNLISTED, name, fix}."""
    return table().get(code) or {
        "verdict": "UNLISTED",
        "name": f"Xid {code}",
        "fix": "look the code up in NVIDIA's Xid table (docs.nvidia.com/deploy/xid-errors)",
    }
