"""The job's containers on the container way (ops/train/incontainer.py builds their commands,
kept in the RunSpec): started on every node before the launch, removed from every node after
it whatever the end, and looked for again among the job's leftovers."""

from __future__ import annotations

from nodeprep.commands.train.runspec import RunSpec


def start(spec: RunSpec, fleet) -> dict[str, str]:
    """Start the job's container on every node: node -> why, for each that did not start."""
    if not spec.containers:
        return {}
    got = fleet.map(
        lambda s: s.run(spec.containers[s.name]["start"], timeout=300, label="start container"),
        "containers",
        only=list(spec.containers),
    )
    bad = {n: r.tail(3) or f"exit {r.rc}" for n, r in got.items() if r.rc != 0}
    bad.update({n: "unreachable" for n in spec.containers if n not in got})
    return bad


def remove(boxes: dict, fleet) -> None:
    """Remove the job's container (BOXES: a RunSpec's `containers`) from every node still
    connected (failed ones too: a start that timed out may have made it), whatever runs in it."""
    if boxes:
        fleet.cleanup(
            lambda s: s.run(boxes[s.name]["remove"], timeout=120, label="remove"),
            "containers",
            only=list(boxes),
        )


def left(spec: RunSpec, fleet, nodes: list[str]) -> dict[str, list[dict]]:
    """node -> the job's container still there, as a leftover (the JOB_PROCESSES shape)."""
    if not spec.containers:
        return {}
    got = fleet.map(
        lambda s: s.run(spec.containers[s.name]["left"], timeout=60, label="containers?"),
        "leftovers",
        only=[n for n in nodes if n in spec.containers],
    )
    # a node whose engine did not answer cannot say none is left: it is named, not passed
    return {
        n: [
            {
                "pid": 0,
                "job": spec.job_id,
                "args": f"container {r.stdout.split()[0]}"
                if r.rc == 0
                else f"UNKNOWN whether a container is left: {r.tail(1) or f'exit {r.rc}'}",
            }
        ]
        for n, r in got.items()
        if r.rc != 0 or r.stdout.split()
    }
