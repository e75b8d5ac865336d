"""nodeprep's native format written (`invoke init`): a commented hosts.yml from hosts, groups
and what was learned about each node. Pure: data in, text out. Every value is written as a
YAML scalar that reads back as the same string (JSON-quoted where plain would not), so what a
source said reaches the file literally or not at all; a comment never holds a newline."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

_PLAIN = re.compile(r"[A-Za-z0-9_./][A-Za-z0-9_./@+-]*")
_RESERVED = {"null", "true", "false", "yes", "no", "on", "off", "~", "y", "n"}


def scalar(value) -> str:
    """VALUE as one YAML scalar (numbers stay numbers)."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int):
        return str(value)
    text = str(value)
    if (
        _PLAIN.fullmatch(text)
        and text.lower() not in _RESERVED
        and not re.fullmatch(r"[0-9.eE+-]+", text)
    ):
        return text
    # a YAML double-quoted scalar: JSON's escapes, characters beyond ASCII as they are (JSON's
    # \ud800\udc00 pairs are two characters to YAML), the few YAML may not hold raw escaped
    return "".join(
        c if _printable(c) else f"\\u{ord(c):04x}" if ord(c) < 0x10000 else f"\\U{ord(c):08x}"
        for c in json.dumps(text, ensure_ascii=False)
    )


def _printable(c: str) -> bool:
    """YAML 1.1's printable set (c-printable), which a double-quoted scalar may hold raw."""
    o = ord(c)
    if o in (0x85, 0x2028, 0x2029):  # line breaks to YAML 1.1: escaped, never folded
        return False
    return (
        o in (0x9, 0xA, 0xD)
        or 0x20 <= o <= 0x7E
        or 0xA0 <= o <= 0xD7FF
        or 0xE000 <= o <= 0xFFFD
        or 0x10000 <= o <= 0x10FFFF
    )


def comment(text: str) -> str:
    return " ".join(str(text).split())


@dataclass
class NodeEntry:
    name: str
    values: dict  # address, port, user, key, python ... as read
    notes: list[str] = field(default_factory=list)  # what was learned (comments above it)


def render(
    title: list[str],
    wide: dict,
    wide_notes: dict,
    nodes: list[NodeEntry],
    groups: dict[str, list[str]],
) -> str:
    """The file: TITLE comment lines, `vars:` (WIDE, each with its note), `hosts:` (each with its
    notes above it), `groups:` (name -> its hosts)."""
    out = [f"# {comment(t)}" if t else "#" for t in title]
    if wide:
        out.append("vars:")
        for k, v in wide.items():
            if wide_notes.get(k):
                out.append(f"  # {comment(wide_notes[k])}")
            out.append(f"  {k}: {scalar(v)}")
    out.append("hosts:")
    for n in nodes:
        out += [f"  # {comment(t)}" for t in n.notes]
        body = ", ".join(f"{k}: {scalar(v)}" for k, v in n.values.items())
        out.append(f"  {scalar(n.name)}: {{{body}}}" if body else f"  {scalar(n.name)}: {{}}")
    if groups:
        out.append("groups:")
        for g, members in groups.items():
            out.append(f"  {scalar(g)}: {{hosts: [{', '.join(scalar(m) for m in members)}]}}")
    return "\n".join(out) + "\n"
