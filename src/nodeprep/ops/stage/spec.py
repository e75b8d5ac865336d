"""What one stage is (source, destination, shard or not, the node holding the source), from
the command line or from the inventory's `stages` variable (src/nodeprep/inventory/defaults.yml),
every bad entry named at the inventory's file:line."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nodeprep.errors import InputError

KEYS = {"src": str, "dest": str, "shard": bool, "from": str}


@dataclass(frozen=True)
class Spec:
    name: str  # the inventory's name for it; "" for SRC DEST given to `invoke stage`
    src: str  # a path here, or on FROM_NODE
    dest: str  # absolute, or ~/... on each node
    shard: bool = False
    from_node: str | None = None

    @property
    def title(self) -> str:
        where = f"{self.from_node}:" if self.from_node else ""
        return f"{self.name + ': ' if self.name else ''}{where}{self.src} -> {self.dest}"


def check_dest(dest: str, file: str | None = None, line: int | None = None) -> None:
    if not (dest == "~" or dest.startswith(("/", "~/"))):
        raise InputError(
            f"stage: dest {dest!r} must be absolute or start with ~/",
            hint="a node has no working directory of yours: say where on it",
            file=file,
            line=line,
        )


def from_inventory(
    stages, names: list[str], where: tuple[str | None, int | None], nodes: set[str]
) -> list[Spec]:
    """The specs NAMES of the inventory's STAGES value (set at WHERE, file and line); NODES:
    the inventory's node names (a `from` must be one)."""
    file, line = where
    if not isinstance(stages, dict):
        raise InputError("stages: expected a mapping of names", file=file, line=line)
    out = []
    for name in names:
        if name not in stages:
            known = ", ".join(sorted(stages)) or "none"
            raise InputError(
                f"stage {name!r} is not in the inventory's stages (it has: {known})",
                hint="add it under `stages:`, or give SRC DEST",
                file=file,
                line=line,
            )
        out.append(_one(name, stages[name], file, line, nodes))
    return out


def _one(name: str, entry, file, line, nodes: set[str]) -> Spec:
    def bad(what: str, hint: str) -> InputError:
        return InputError(f"stages: {name}: {what}", hint=hint, file=file, line=line)

    if not isinstance(entry, dict):
        raise bad("expected a mapping {src, dest, shard, from}", "e.g. {src: data, dest: ~/data}")
    for key, value in entry.items():
        if key not in KEYS:
            raise bad(f"unknown key {key!r}", "keys: " + ", ".join(KEYS))
        if not isinstance(value, KEYS[key]) or (KEYS[key] is str and not value):
            raise bad(f"{key}: {value!r} is not {KEYS[key].__name__}", f"set {key} as one")
    for key in ("src", "dest"):
        if key not in entry:
            raise bad(f"{key} is missing", "a stage needs src and dest")
    check_dest(entry["dest"], file, line)
    src = entry["src"]
    if "from" in entry:
        if entry["from"] not in nodes:
            raise bad(f"from: {entry['from']!r} is not a node of the inventory", "name a node")
    elif not Path(src).expanduser().is_absolute() and file:
        src = str(Path(file).resolve().parent / src)  # relative to the inventory's file
    return Spec(name, src, entry["dest"], bool(entry.get("shard", False)), entry.get("from"))
