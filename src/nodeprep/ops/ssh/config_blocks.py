"""The controller's ssh config: one managed `hosts <inventory>` block per inventory, and the
Host aliases that other inventories' blocks or the user's own entries already define.

ssh takes the FIRST value it finds for an option, so two blocks that both say `Host worker-1`
send `ssh worker-1` (and every launcher using the alias) to whichever comes first, silently.
`conflicts()` finds every alias this inventory would write that is already defined elsewhere in
the file with another HostName or Port, so provision can refuse it naming both places (or the
inventory sets `ssh_alias_prefix`). Aliases are read as `inventory.sshconfig` reads them: the
literal names of `Host` lines (ssh's quoting and comment rules), resolved by OpenSSH itself
(`ssh -G`: first value wins, `Host *` defaults apply), one block at a time.

`word()` writes a value as one ssh_config argument: ssh expands %-tokens in HostName,
IdentityFile and UserKnownHostsFile, so '%' is doubled; a value with whitespace is
double-quoted; '"' cannot be written at all (ssh_config has no escape for it).
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import KW_ONLY, dataclass
from pathlib import Path

from nodeprep.engine.steps import without_block
from nodeprep.errors import InputError
from nodeprep.inventory import openssh
from nodeprep.inventory.sshconfig import aliases

BEGIN = re.compile(r"# BEGIN nodeprep hosts (.+) \(managed: edits inside this block are replaced\)")
END = "# END nodeprep hosts "


def word(value: str) -> str:
    if '"' in value or "\n" in value or "\r" in value:
        raise ValueError(
            f"{value!r} cannot be written into an ssh config (it has '\"' or a newline)"
        )
    value = value.replace("%", "%%")
    return f'"{value}"' if re.search(r"\s", value) else value


@dataclass(frozen=True)
class Defined:
    alias: str
    hostname: str | None  # None: the entry sets no HostName of its own
    port: int | None
    _: KW_ONLY
    where: str  # FILE:LINE, and the block's inventory if it is one
    block: str | None = None  # the managed block's inventory; None: the user's own entry


def _segments(lines: list[str]) -> dict[str | None, list[tuple[int, str]]]:
    """Lines by managed block (its inventory name), the user's own under None."""
    out: dict[str | None, list[tuple[int, str]]] = {None: []}
    current = None
    for number, line in enumerate(lines, 1):
        text = line.rstrip("\r\n")
        m = BEGIN.fullmatch(text)
        if m and current is None:
            current = m.group(1)
            out.setdefault(current, [])
            continue
        if current is not None and text == END + current:
            current = None
            continue
        out.setdefault(current, []).append((number, line))
    return out


def defined(
    text: str, file: str, own: str, names: set[str] | None = None
) -> dict[str, list[Defined]]:
    """alias -> where TEXT (the file FILE) defines it, outside the managed block OWN (only the
    aliases in NAMES, when given). Each block is resolved on its own by OpenSSH (`ssh -G -F`
    over that block's lines): what it would send the alias to."""
    found: dict[str, list[Defined]] = {}
    for block, numbered in _segments(text.splitlines()).items():
        listed = [(a, n) for a, n in aliases(numbered) if names is None or a in names]
        if block == own or not listed:
            continue
        label = f" (the block of inventory '{block}')" if block else ""
        got = _resolve_alone(
            "\n".join(line.rstrip("\r\n") for _, line in numbered) + "\n", [a for a, _ in listed]
        )
        for alias, number in listed:
            r = got.get(alias)
            if r is None:  # ssh rejects this block: an entry ssh cannot use defines nothing
                continue
            hostname = r.hostname
            found.setdefault(alias, []).append(
                Defined(
                    alias,
                    None if hostname == alias else hostname,
                    r.port if r.one("port") else None,
                    where=f"{file}:{number}{label}",
                    block=block,
                )
            )
    return found


def _resolve_alone(text: str, names: list[str]) -> dict:
    """NAMES as `ssh -G -F` answers them over TEXT alone; {} when ssh rejects TEXT."""
    with tempfile.NamedTemporaryFile("w", suffix=".ssh_config", delete=False) as fh:
        fh.write(text)
    try:
        os.chmod(fh.name, 0o600)
        return openssh.resolve(names, Path(fh.name))
    except InputError:
        return {}
    finally:
        os.unlink(fh.name)


def block_name(inventory, project: Path) -> str:
    """The block of INVENTORY (inventory.model.Inventory) in the controller's file: its name
    for inventory/NAME, else its path (a file or directory given by path)."""
    if inventory.path is None:
        return inventory.name
    path = Path(inventory.path).resolve()
    if path.parent == (Path(project) / "inventory").resolve():
        return path.name
    return str(path)


def block_alive(name: str, project: Path) -> bool:
    """Whether the inventory a block is named after still exists (a path, or inventory/NAME)."""
    return Path(name).exists() if "/" in name else (Path(project) / "inventory" / name).exists()


def blocks(text: str) -> list[tuple[str, int]]:
    """(inventory, line of its BEGIN) of every managed block in TEXT, in order."""
    return [
        (m.group(1), n)
        for n, line in enumerate(text.splitlines(), 1)
        if (m := BEGIN.fullmatch(line.rstrip("\r\n")))
    ]


def prune(text: str, project: Path) -> tuple[str, list[str]]:
    """TEXT without the blocks whose inventory no longer exists (everything else byte for
    byte), and their names."""
    gone = [name for name, _ in blocks(text) if not block_alive(name, project)]
    for name in gone:
        text = without_block(text, f"hosts {name}")
    return text, gone


def conflicts(wanted: list[tuple[str, str, int, str]], text: str, file: str, own: str) -> list[str]:
    """For each (alias, address, port, where it is defined) of WANTED already defined in TEXT
    outside block OWN with another HostName or Port: one sentence naming both places."""
    known = defined(text, file, own, {alias for alias, *_ in wanted})
    out = []
    for alias, address, port, where in wanted:
        for d in known.get(alias, []):
            if d.hostname not in (None, address) or d.port not in (None, port):
                there = f"{d.hostname or alias}:{d.port or 22}"
                out.append(
                    f"Host {alias} is already defined at {d.where} as {there}; this "
                    f"inventory ('{own}', {where}) has it at {address}:{port}"
                )
    return out
