"""Text for `invoke inventory`: the host table, the group tree, one host's variables."""

from __future__ import annotations


def _table(cols: list[str], rows: list[list]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(cols, *rows)]
    fmt = lambda row: "  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip()
    return "\n".join([fmt(cols)] + [fmt(r) for r in rows])


def hosts(view) -> str:
    inv = view.inventory
    rows = [
        [h.name, h.address, h.port, h.user or "-", h.connection, ",".join(h.groups) or "-"]
        for h in inv.hosts
    ]
    head = f"{len(inv.hosts)} host(s) from {inv.name} ({inv.kind})"
    if not rows:
        return head
    return head + "\n" + _table(["host", "address", "port", "user", "connection", "groups"], rows)


def graph(view) -> str:
    """Like `ansible-inventory --graph`: @group lines, children before hosts."""
    inv, out = view.inventory, ["@all:"]

    def walk(group: str, depth: int, seen: tuple) -> None:
        pad = "  |" * depth
        for child in inv.children.get(group, []):
            if child in seen:
                continue
            out.append(f"{pad}--@{child}:")
            walk(child, depth + 1, seen + (child,))
        for name in inv.direct.get(group, []) if group != "all" else []:
            out.append(f"{pad}--{name}")

    walk("all", 1, ("all",))
    return "\n".join(out)


def host(view) -> str:
    h = view.host
    lines = [
        f"{h.name}: {h.user + '@' if h.user else ''}{h.address}:{h.port} "
        f"({h.connection}), groups: {', '.join(h.groups) or '-'}"
        + (f", through {' -> '.join(str(hop) for hop in h.jump)}" if h.jump else "")
    ]
    rows = [
        [
            v.name,
            _value(v.value),
            v.origin
            + (
                f"  ({v.kind}: {v.why})" if v.kind else "" if v.used else "  (not used by nodeprep)"
            ),
        ]
        for v in view.variables
    ]
    return "\n".join(lines) + "\n" + _table(["variable", "value", "from"], rows)


def _value(value) -> str:
    text = (
        "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    )
    return text if len(text) <= 60 else text[:57] + "..."
