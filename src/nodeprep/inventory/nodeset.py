"""Node ranges as ClusterShell and Slurm write them: `gpu[01-04,07]`, `rack[1-2]-node[1-8]`.

expand() turns a pattern into names, split_list() reads a comma list such as
SLURM_JOB_NODELIST, fold() turns names back into the shortest pattern for reports
(`worker-[0-6]  torch 2.5.1`). A leading zero in a range start fixes the width, so
`gpu[08-10]` gives gpu08, gpu09, gpu10. Ansible's `[01:04]` is accepted as `[01-04]`.
A pattern stands for at most MAX_NAMES names (a typo like gpu[1-10000000] is refused, not
expanded), a range's numbers have at most 9 digits.
"""

from __future__ import annotations

import itertools
import math
import re

MAX_NAMES = 100_000
_RANGE = re.compile(r"([0-9]{1,9})(?:[-:]([0-9]{1,9}))?")
_LAST_NUMBER = re.compile(r"^(.*?)(\d+)(\D*)$")


def expand(pattern: str) -> list[str]:
    """All names a pattern stands for, in order; a plain name stands for itself."""
    parts: list[list[str]] = []
    rest = pattern.strip()
    if not rest:
        raise ValueError("empty node name")
    while rest:
        open_at = rest.find("[")
        close_at = rest.find("]")
        if open_at < 0:
            if close_at >= 0:
                raise ValueError(f"bad node range '{pattern}': ']' without '['")
            parts.append([rest])
            break
        if close_at < open_at:
            raise ValueError(f"bad node range '{pattern}': unclosed '[' or stray ']'")
        inner = rest[open_at + 1 : close_at]
        if "[" in inner:
            raise ValueError(f"bad node range '{pattern}': unclosed '['")
        parts.append([rest[:open_at]])
        parts.append(_expand_ranges(inner, pattern))
        rest = rest[close_at + 1 :]
    if math.prod(len(p) for p in parts) > MAX_NAMES:
        raise ValueError(f"bad node range '{pattern}': more than {MAX_NAMES} names")
    return ["".join(combo) for combo in itertools.product(*parts)]


def _expand_ranges(inner: str, pattern: str) -> list[str]:
    out: list[str] = []
    for item in inner.split(","):
        match = _RANGE.fullmatch(item.strip())
        if not match:
            raise ValueError(
                f"bad node range '{pattern}': '{item}' is not a number "
                f"(of at most 9 digits) or a range like 1-4 or 01-04"
            )
        lo_text, hi_text = match.group(1), match.group(2) or match.group(1)
        lo, hi = int(lo_text), int(hi_text)
        if lo > hi:
            separator = item.strip()[len(lo_text)]
            raise ValueError(
                f"bad node range '{pattern}': {item} goes backwards, "
                f"write {hi_text}{separator}{lo_text}"
            )
        width = len(lo_text) if lo_text.startswith("0") and len(lo_text) > 1 else 0
        if len(out) + hi - lo >= MAX_NAMES:
            raise ValueError(f"bad node range '{pattern}': more than {MAX_NAMES} names")
        out.extend(f"{n:0{width}d}" for n in range(lo, hi + 1))
    return out


def split_top(text: str) -> list[str]:
    """Split a comma list, ignoring commas inside brackets: `a[1,3],b` -> `a[1,3]`, `b`."""
    items = []
    depth = 0
    current = ""
    for char in text:
        depth += (char == "[") - (char == "]")
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    items.append(current)
    return [item.strip() for item in items if item.strip()]


def split_list(text: str) -> list[str]:
    """Names in a Slurm-style node list: `gpu-[01-03,05],cpu1,n[1-2]-ib`."""
    return [name for item in split_top(text) for name in expand(item)]


def fold(names) -> str:
    """The inverse of split_list: `worker-[0-3,5]`, `gpu[01-04,07],login1`.

    Names are grouped by what surrounds their last number; groups keep the order in
    which they first appear, numbers inside a group are sorted.
    """
    groups: dict[tuple[str, str], list[str]] = {}
    plain: dict[str, None] = {}
    order: list[tuple[str, str] | str] = []
    for name in names:
        match = _LAST_NUMBER.match(name)
        if not match:
            if name not in plain:
                plain[name] = None
                order.append(name)
            continue
        key = (match.group(1), match.group(3))
        if key not in groups:
            groups[key] = []
            order.append(key)
        if match.group(2) not in groups[key]:
            groups[key].append(match.group(2))
    out = []
    for key in order:
        if isinstance(key, str):
            out.append(key)
            continue
        prefix, suffix = key
        numbers = groups[key]
        ranges = _fold_numbers(numbers)
        body = ranges if len(numbers) == 1 else f"[{ranges}]"
        out.append(f"{prefix}{body}{suffix}")
    return ",".join(out)


def _fold_numbers(numbers: list[str]) -> str:
    runs: list[list[str]] = []
    for text in sorted(numbers, key=lambda t: (int(t), t)):
        if runs and _follows(runs[-1], text):
            runs[-1][1] = text
        else:
            runs.append([text, text])
    return ",".join(lo if lo == hi else f"{lo}-{hi}" for lo, hi in runs)


def _follows(run: list[str], text: str) -> bool:
    """True if `text` is the next number of the run, written with the run's padding."""
    first, last = run
    padded = first.startswith("0") and len(first) > 1
    expected = int(last) + 1
    return text == (f"{expected:0{len(first)}d}" if padded else str(expected))
