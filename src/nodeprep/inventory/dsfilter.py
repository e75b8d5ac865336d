"""DeepSpeed's `--include` / `--exclude` strings as `--limit`: nodes AND slots, read as
DeepSpeed's runner reads them (deepspeed 0.19.8, deepspeed/launcher/runner.py:
parse_node_config, parse_node_config_list, parse_resource_filter).

  --limit 'worker-0@worker-1:0,2'   worker-0 with all its slots, worker-1 with slots 0 and 2
  --limit '!worker-1:0'             every node and slot but slot 0 of worker-1 (--exclude)

A limit with `@` or `:` is such a string (no node name holds either). NODE_SPEC[@NODE_SPEC...],
NODE_SPEC = NAME[:SLOT[,SLOT...]]; a name given twice merges its slots (sorted, each once); an
include of a bare name takes all its slots, an exclude of a bare name drops the node; a node
left without slots is dropped; nodes keep the inventory's order. Slots are checked against a
node's slots when they are known (train: its GPUs or `slots`), as DeepSpeed checks them
against the hostfile."""

from __future__ import annotations

from dataclasses import dataclass

from nodeprep.errors import InputError

NODE_SEP = "@"
SLOT_START = ":"
SLOT_SEP = ","
HINT = (
    "DeepSpeed's form: NAME[:SLOT[,SLOT...]][@NAME...], "
    "e.g. worker-0@worker-1:0,2 (! first excludes)"
)


def is_filter(limit: str | None) -> bool:
    return bool(limit) and (NODE_SEP in limit or SLOT_START in limit)


@dataclass(frozen=True)
class Filter:
    exclude: bool
    nodes: dict[str, list[int]]  # name -> its slots (sorted, unique); [] for the whole node

    def pick(self, order: list[str]) -> list[str]:
        """The nodes the filter keeps, in ORDER, before slots are known: an exclude keeps a node
        it names with slots (some may be left)."""
        if self.exclude:
            return [n for n in order if not (n in self.nodes and not self.nodes[n])]
        return [n for n in order if n in self.nodes]


def parse(limit: str) -> Filter:
    """LIMIT as DeepSpeed's parse_node_config_list reads it; InputError for what it refuses."""
    exclude = limit.startswith("!")
    text = limit[1:] if exclude else limit
    nodes: dict[str, list[int]] = {}
    for spec in text.split(NODE_SEP):
        if spec.count(SLOT_START) > 1:
            raise InputError(f"limit {limit!r}: {spec!r} has more than one ':'", HINT)
        name, colon, slots = spec.partition(SLOT_START)
        if not name:
            raise InputError(f"limit {limit!r}: a node spec without a name", HINT)
        ids = []
        if colon:
            for s in slots.split(SLOT_SEP):
                try:
                    ids.append(int(s))
                except ValueError:
                    raise InputError(
                        f"limit {limit!r}: slot {s!r} on {name!r} is not a number", HINT
                    ) from None
        nodes[name] = nodes.get(name, []) + ids
    return Filter(exclude, {n: sorted(set(ids)) for n, ids in nodes.items()})


def apply(f: Filter, slots: dict[str, int]) -> dict[str, list[int]]:
    """parse_resource_filter: SLOTS (name -> slot count, in the fleet's order) filtered by F;
    InputError where DeepSpeed raises (a node or slot the fleet does not have)."""
    pool = {n: list(range(k)) for n, k in slots.items()}
    kept: dict[str, list[int]] = {n: list(v) for n, v in pool.items()} if f.exclude else {}
    for name, ids in f.nodes.items():
        if name not in pool:
            raise InputError(
                f"limit: node {name!r} is not among the selected nodes "
                f"({', '.join(pool) or 'none'})",
                HINT,
            )
        bad = [i for i in ids if i not in pool[name]]
        if bad:
            raise InputError(
                f"limit: {name} has no slot {bad[0]} (its slots: 0..{len(pool[name]) - 1})",
                "slots are a node's GPU ids (or its processes on CPU)",
            )
        if f.exclude:
            kept[name] = [i for i in kept[name] if i not in ids] if ids else []
        else:
            kept[name] = ids or pool[name]
    return {n: kept[n] for n in slots if kept.get(n)}
