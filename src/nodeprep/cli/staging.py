"""`invoke stage`: its entry point and its result as text (a line per stage, a line per node,
the totals); progress is the live table's (each node's bytes, rate and time left)."""

from __future__ import annotations

from nodeprep.cli.display import Display
from nodeprep.cli.guard import guarded, print_json
from nodeprep.commands.options import StageOptions
from nodeprep.settings import Settings


@guarded
def stage(opts: StageOptions, settings: Settings = Settings()) -> int:
    from nodeprep.commands import stage as stage_cmd

    res = stage_cmd.stage(opts, settings, Display.auto(to_stderr=True))
    if opts.json:
        print_json(res.as_dict())
    else:
        print(text(res))
    return res.exit_code


def _size(n: int) -> str:
    for unit, k in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= k:
            return f"{n / k:.1f} {unit}"
    return f"{n} B"


def text(res) -> str:
    """Each stage: what it is, each node's outcome, the totals."""
    out = []
    for st in res.stages:
        out.append(f"stage {st.spec.title}: {st.files} file(s), {_size(st.nbytes)}")
        width = max([len(n.node) for n in st.nodes] + [4])
        for n in sorted(st.nodes, key=lambda n: n.node):
            line = f"  {n.node:<{width}}  {n.status:<11}"
            if n.status in ("staged", "would stage", "failed") and (n.lacked or n.files):
                line += f" {_size(n.lacked)} in {n.files} file(s)"
            if n.via and n.status == "staged":
                line += f" (from {n.via})"
            if n.error:
                line = f"{line.rstrip()}: {n.error}"
            out.append(line.rstrip())
        moved = [n for n in st.nodes if n.status == "staged"]
        if res.dry_run:
            out.append("  dry run: nothing moved")
        elif not moved and st.ok:
            how = "every file hashed there" if st.verified else "as its record says"
            out.append(f"  nothing to change: every node holds it ({how})")
        elif moved:
            how = "chained node to node" if st.chained else "a stream per node"
            out.append(
                f"  {len(moved)} node(s) filled in {st.seconds:.1f} s, {how}; the controller "
                f"sent {_size(st.sent_here)}; every chunk checked against its sha256 on arrival"
            )
    return "\n".join(out)
