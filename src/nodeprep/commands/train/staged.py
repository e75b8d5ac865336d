"""`train --stage NAME`: the inventory's stages run on the job's nodes before anything launches
(commands/stage.py's run, over the job's own connections), sharded by the job's ranks: the
nodes the health gate kept, in the job's order. A stage that leaves a node without its data
stops the job before launch; under --restarts each attempt stages again (a spare that joins
gets its data; nodes that hold it already move nothing)."""

from __future__ import annotations

from nodeprep.commands.options import StageOptions, TrainOptions
from nodeprep.errors import InputError, NodeprepError


def before_launch(fleet, names: list[str], opts: TrainOptions, inv, settings) -> None:
    """Every stage OPTS names on NAMES (FLEET's sessions); with --dry-run, what would move
    is said and nothing moves."""
    if not opts.stages:
        return
    from nodeprep.commands import stage as stage_cmd

    sopts = StageOptions(names=opts.stages, dry_run=opts.dry_run)
    hosts = [fleet.sessions[n].host for n in names]
    for spec in stage_cmd.specs_for(sopts, inv, hosts):
        if spec.from_node and spec.from_node not in fleet.sessions:
            raise InputError(
                f"stage {spec.name}: from {spec.from_node}, which is not a node of this job",
                hint=f"stage it first: invoke stage --name {spec.name}, or drop `from`",
            )
        res = stage_cmd.run_one(fleet, names, spec, sopts, settings)
        failed = [n for n in res.nodes if n.status == "failed"]
        if failed:
            raise NodeprepError(
                f"stage {spec.title} failed on {', '.join(n.node for n in failed)}: "
                f"{failed[0].error or 'no answer'}; nothing launched",
                hint=f"invoke stage --name {spec.name} says more; run train again once it passes",
            )
        moved = [n for n in res.nodes if n.status in ("staged", "would stage")]
        verb = "would move" if opts.dry_run else "moved"
        fleet.events.log(
            f"stage {spec.title}: {verb} {sum(n.lacked for n in moved) / 1e6:.1f} MB to "
            f"{len(moved)} node(s)"
            if moved
            else f"stage {spec.title}: nothing to change"
        )
