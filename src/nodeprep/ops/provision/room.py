"""Whether a node has room for what a provision writes there (engine/steps.Room: a wheel push,
a venv), from the ROOM fact of each path (engine/facts/system.py: space, inodes, writable,
read-only), and the one-line reason when it has not: before anything is applied, so the node
is refused with the numbers while the others go on, and after a step failed, to name the
cause ("no space on /home: 38 MiB free, the venv needs 1.4 GiB") instead of pip's last line.

Sizes: a venv takes about 4.6 times its wheels on disk and 125 files per MB of wheels (the
lab's torch 2.13.0+cpu stack: 219 MB of wheels, a 1007 MB venv of 27,406 files; 2026-11-25)."""

from __future__ import annotations

VENV_BYTES_PER_WHEEL_BYTE = 4.6
VENV_FILES_PER_WHEEL_MB = 125


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit in ("B", "KiB", "MiB") else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def problem(room: dict | None, needs: list) -> str | None:
    """Why the file system of ROOM (a ROOM fact) cannot take NEEDS (steps.Room of the steps
    that write there, added up), or None. None also when ROOM could not be read: the step
    itself then says what went wrong."""
    if not room:
        return None
    where = room["mount"]
    if room["readonly"]:
        return (
            f"read-only file system {where} (where {room['dir']} is): nothing can be written there"
        )
    if not room["writable"]:
        return (
            f"no permission to write {room['dir']}: fix its owner or mode, or choose another path"
        )
    need = sum(r.bytes for r in needs)
    what = " and ".join(r.what for r in needs)
    if room["free"] < need:
        return (
            f"no space on {where}: {human(room['free'])} free, {what} "
            f"need{'s' if len(needs) == 1 else ''} {human(need)}"
        )
    files = sum(r.files for r in needs)
    if room["inodes_free"] is not None and room["inodes_free"] < files:
        return (
            f"no inodes left on {where}: {room['inodes_free']} free, "
            f"{what} need{'s' if len(needs) == 1 else ''} {files}"
        )
    return None


def problems(rooms: dict, wanted: list) -> dict:
    """{index of a step in WANTED: why} for the steps whose file system has no room. WANTED:
    [(step index, Room)]; ROOMS: {Room.path: the ROOM fact}. Steps writing to one file system
    are added up (the wheels and the venv both in the home)."""
    by_mount: dict = {}
    for i, r in wanted:
        fact = rooms.get(r.path)
        key = fact["mount"] if fact else r.path
        by_mount.setdefault(key, []).append((i, r, fact))
    out = {}
    for items in by_mount.values():
        why = problem(items[0][2], [r for _, r, _ in items])
        if why:
            out.update({i: why for i, _, _ in items})
    return out
