"""What a stage moves, decided from data alone (no node, no file is touched here): the source's
files and chunk sums (a Manifest, as nodeside/stage.py's scan lists them), which of them each
node gets (all, or its shard by rank), what each node still lacks after what it holds (its
State: the staged files its record vouches for, the verified chunks of interrupted files), the
room that needs, and the chains the bytes travel along."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

CHUNK = 64 << 20  # bytes per chunk: what an interruption may cost again, and the checksum unit


@dataclass(frozen=True)
class Entry:
    path: str  # relative to the source (and the destination)
    size: int
    mtime: int  # ns
    sums: tuple[str, ...]  # sha256 of each chunk
    mode: int = 0o644  # the source's permission bits

    @property
    def digest(self) -> str:
        return hashlib.sha256("".join(self.sums).encode()).hexdigest()

    def chunk_size(self, i: int, chunk: int = CHUNK) -> int:
        return max(0, min(chunk, self.size - i * chunk))


@dataclass(frozen=True)
class Manifest:
    entries: tuple[Entry, ...]

    @classmethod
    def parse(cls, data: dict) -> Manifest:
        return cls(
            tuple(Entry(p, int(s), int(m), tuple(h), *f[:1]) for p, s, m, h, *f in data["files"])
        )

    @property
    def nbytes(self) -> int:
        return sum(e.size for e in self.entries)


@dataclass(frozen=True)
class State:
    """What a node's DEST holds: {path: digest} of staged files as their record says (and
    still as recorded), {path: (digest, verified chunks)} of interrupted ones, free bytes;
    SUSPECT: files the record vouches for that --verify found otherwise (resent whatever the
    node's record says); IDENT: DEST's identity (nodes that see one directory share it)."""

    staged: dict
    parts: dict
    free: int
    suspect: frozenset = frozenset()
    ident: str | None = None

    @classmethod
    def parse(cls, data: dict) -> State:
        staged = {p: e[2] for p, e in data["record"].items()}
        parts = {p: (e[0], frozenset(e[2])) for p, e in data["parts"].items()}
        return cls(staged, parts, int(data["free"]), ident=data.get("id"))


@dataclass(frozen=True)
class Need:
    entry: Entry
    chunks: tuple[int, ...]
    force: bool = False  # the node's record of it is not to be trusted (--verify)

    @property
    def nbytes(self) -> int:
        return sum(self.entry.chunk_size(i) for i in self.chunks)


def shards(manifest: Manifest, nodes: list[str], shard: bool) -> dict[str, list[Entry]]:
    """Each node's files: all of them, or with SHARD the files whose index in path order
    modulo the node count is the node's rank (its place in NODES, the job's order)."""
    if not shard:
        return {n: list(manifest.entries) for n in nodes}
    ordered = sorted(manifest.entries, key=lambda e: e.path)
    return {n: ordered[r :: len(nodes)] for r, n in enumerate(nodes)}


def needs(entries: list[Entry], state: State) -> list[Need]:
    """What a node holding STATE lacks of ENTRIES: a staged file of the same digest is there;
    an interrupted one of the same digest lacks the chunks it has not verified, and one with
    every chunk verified but not in place (its rename failed) gets its last chunk again, which
    finishes it."""
    out = []
    for e in entries:
        if state.staged.get(e.path) == e.digest:
            continue
        part = state.parts.get(e.path)
        have = part[1] if part and part[0] == e.digest else frozenset()
        missing = tuple(i for i in range(len(e.sums)) if i not in have) or (len(e.sums) - 1,)
        out.append(Need(e, missing, e.path in state.suspect))
    return out


def short_of_room(need: list[Need], state: State) -> int:
    """Bytes a node lacks to take NEED (0 when it has room)."""
    return max(0, sum(n.nbytes for n in need) - state.free)


@dataclass
class Chain:
    """NODES fed one stream in turn (the source -> nodes[0] -> nodes[1] ...) with the union
    of what they lack: a node passes on what it already holds without writing it again."""

    nodes: list[str]
    need: list[Need] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(n.nbytes for n in self.need)


def chains(wants: dict[str, list[Need]], order: list[str], shard: bool, relay: bool) -> list:
    """The chains: one over every node that lacks anything (in ORDER) when every node gets
    the same files and RELAY is on; one per node otherwise (a shard each, or no relay)."""
    lacking = [n for n in order if wants.get(n)]
    if shard or not relay:
        return [Chain([n], list(wants[n])) for n in lacking]
    if not lacking:
        return []
    union: dict[str, set] = {}
    entries: dict[str, Entry] = {}
    force: set = set()
    for n in lacking:
        for need in wants[n]:
            union.setdefault(need.entry.path, set()).update(need.chunks)
            entries[need.entry.path] = need.entry
            if need.force:
                force.add(need.entry.path)
    need = [Need(entries[p], tuple(sorted(union[p])), p in force) for p in sorted(union)]
    return [Chain(lacking, need)]


def request(need: list[Need]) -> list:
    """NEED as nodeside/stage.py's send reads it: [path, size, mtime, chunk, sums, chunks,
    mode, force]."""
    return [
        [e.path, e.size, e.mtime, CHUNK, list(e.sums), list(n.chunks), e.mode, n.force]
        for n in need
        for e in [n.entry]
    ]
