"""Host keys as Ansible reads them: `host:port`, `[v6]:port`, bare IPv6 and `[a:b:step]` ranges.

Ansible's rules (ansible.parsing.utils.addresses and the inventory plugins' hostpattern
expansion, re-implemented here from their documented behaviour):

- `NAME:PORT` gives a port when NAME has no other colon outside a range; `[ADDR]:PORT`
  brackets an IPv6 address; a bare IPv6 address (`2001:db8::1`) has no port.
- What is left must be an IPv4 address, an IPv6 address or a host name (labels of word
  characters and `-`, not ending in `-` or `_`), each part possibly a range. A key that is
  none of these is taken whole as the name, without a port, as Ansible does.
- A range is `[BEGIN:END]` or `[BEGIN:END:STEP]`, numbers or single letters; a number that
  starts with 0 fixes the width and END must then have the same width; an empty BEGIN is 0.
  Several ranges in one name multiply; a key stands for at most MAX_NAMES names (beyond,
  RangeError: a typo like web[1:10000000] is refused, not expanded).
"""

from __future__ import annotations

import ipaddress
import re
import string

_RANGE = r"\[(?:[a-z]:[a-z]|[0-9]+:[0-9]+)(?::[0-9]+)?\]"
_NUM_RANGE = r"\[[0-9]+:[0-9]+(?::[0-9]+)?\]"
_HEX_RANGE = r"\[[0-9a-f]+:[0-9a-f]+(?::[0-9]+)?\]"
_LABEL = rf"(?:\w|{_RANGE})(?:[\w-]|{_RANGE})*(?<![_-])"
_HOSTNAME = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*$", re.I | re.UNICODE)
_V4_PART = rf"(?:25[0-5]|2[0-4][0-9]|[01]?[0-9]?[0-9]|{_NUM_RANGE})"
_IPV4 = re.compile(rf"^{_V4_PART}(?:\.{_V4_PART}){{3}}$")
_BRACKETED = re.compile(r"^\[(.+)\]:([0-9]+)$")
_HOSTPORT = re.compile(rf"^((?:[^:\[\]]|{_RANGE})*):([0-9]+)$", re.I)


MAX_NAMES = 100_000


class RangeError(ValueError):
    """A range Ansible refuses; the message says why."""


def _is_ipv6(text: str) -> bool:
    probe = re.sub(_HEX_RANGE, "0", text, flags=re.I)
    try:
        ipaddress.IPv6Address(probe.split("%", 1)[0])
    except ValueError:
        return False
    return True


def parse_address(text: str) -> tuple[str, int | None]:
    """(host, port) of a host key, or ValueError when it is no address or name at all."""
    port = None
    for pattern in (_BRACKETED, _HOSTPORT):
        match = pattern.match(text)
        if match:
            text, port = match.group(1), int(match.group(2))
    if _IPV4.match(text) or _is_ipv6(text) or _HOSTNAME.match(text):
        return text, port
    raise ValueError(f"not a valid network host name: {text}")


def host_pattern(key: str) -> tuple[list[str], int | None]:
    """The names a host key stands for and the port it gives them (None: none given)."""
    try:
        pattern, port = parse_address(key)
    except ValueError:
        pattern, port = key, None
    return (expand(pattern) if "[" in pattern else [pattern]), port


def expand(pattern: str) -> list[str]:
    """Every name of PATTERN, first range first (RangeError for a range Ansible refuses)."""
    head, sep, rest = pattern.partition("[")
    if not sep:
        return [pattern]
    inner, sep, tail = rest.partition("]")
    if not sep:
        raise RangeError(f"'{pattern}': '[' without ']'")
    bounds = inner.split(":")
    if len(bounds) not in (2, 3):
        raise RangeError(f"'{pattern}': a host range is [begin:end] or [begin:end:step]")
    begin, end = bounds[0] or "0", bounds[1]
    step_text = bounds[2] if len(bounds) == 3 else "1"
    if not end:
        raise RangeError(f"'{pattern}': the range has no end")
    width = len(begin) if begin.startswith("0") and len(begin) > 1 else 0
    if width and len(end) != width:
        raise RangeError(
            f"'{pattern}': begin and end of a zero-padded range must have "
            f"the same width ({begin} and {end})"
        )
    try:
        step = int(step_text)
        if step < 1:
            raise ValueError
    except ValueError:
        raise RangeError(f"'{pattern}': the step must be a positive whole number") from None
    letters = string.ascii_letters
    if begin in letters and end in letters and len(begin) == len(end) == 1:
        lo, hi = letters.index(begin), letters.index(end)
        if lo > hi:
            raise RangeError(f"'{pattern}': the range goes backwards")
        items = list(letters[lo : hi + 1 : step])
    else:
        try:
            numbers = range(int(begin), int(end) + 1, step)
        except ValueError:
            raise RangeError(f"'{pattern}': a range is numbers or single letters") from None
        if len(numbers) > MAX_NAMES:
            raise RangeError(f"'{pattern}': more than {MAX_NAMES} names")
        items = [str(n).zfill(width) for n in numbers]
    out: list[str] = []
    for item in items:
        out.extend(expand(f"{head}{item}{tail}"))
        if len(out) > MAX_NAMES:
            raise RangeError(f"'{pattern}': more than {MAX_NAMES} names")
    return out
