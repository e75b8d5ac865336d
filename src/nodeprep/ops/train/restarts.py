"""What `train --restarts N` does after a failed attempt (issue 47), decided from the attempt's
cause (causes.py) and the nodes it ran on: pure, so every rule is unit-tested.

- A cause whose class is not retried (the script's own error by default; Ctrl-C never) stops
  the job, with the reason.
- A budget of N relaunches for the whole job: the (N+1)th failure stops it with every reason.
- The node the cause blames is quarantined and left out; so is each node the health gate
  refuses before the relaunch (the command layer adds those).
- A spare takes each quarantined node's place, in the spares' order, once the command layer
  has provisioned it and parity holds (commands/train/spares.py); one that fails is quarantined.
- The job goes on with fewer nodes only down to --min-nodes (default: as many as it started
  with); below that it stops, naming the nodes it lost and why.
- Between attempts a backoff: 1, 2, 4, ... seconds, at most BACKOFF_MAX.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nodeprep.ops.train.causes import RETRIED, Cause

BACKOFF_MAX = 30.0


@dataclass(frozen=True)
class Policy:
    """What the user allowed: BUDGET relaunches for the whole job (--restarts), the cause classes
    retried (--retry-on), the fewest nodes to go on with (--min-nodes, default all)."""

    budget: int
    min_nodes: int
    retry_on: frozenset[str] = RETRIED


@dataclass
class Decision:
    relaunch: bool
    nodes: list[str]  # the next attempt's nodes (relaunch), else those it last ran on
    quarantine: dict[str, str] = field(default_factory=dict)  # node -> why
    why: str = ""  # why the job stops (not relaunch)
    take: list[str] = field(default_factory=list)  # spares to bring in, one per node lost


def backoff(attempt: int) -> float:
    """Seconds to wait before ATTEMPT (2 = the first relaunch)."""
    return min(BACKOFF_MAX, 2.0 ** max(0, attempt - 2))


def decide(
    cause: Cause | None, attempt: int, nodes: list[str], policy: Policy, spares: tuple = ()
) -> Decision:
    """After ATTEMPT (1 = the first launch) on NODES ended with CAUSE (None: it finished);
    SPARES: the spare nodes not yet used or quarantined."""
    budget, min_nodes = policy.budget, policy.min_nodes
    if cause is None:
        return Decision(False, nodes, why="finished")
    if not cause.retried(policy.retry_on):
        extra = "" if cause.klass == "interrupted" else f" (--retry-on {cause.klass} retries it)"
        return Decision(False, nodes, why=f"{cause.klass} is not retried{extra}")
    if attempt > budget:
        return Decision(
            False, nodes, why=f"the restart budget of {budget} is used up ({attempt} attempts)"
        )
    out = {cause.node: cause.line} if cause.node in nodes else {}
    left = [n for n in nodes if n not in out]
    take = list(spares[: len(out)])
    if len(left) + len(take) < min_nodes:
        return Decision(False, left, out, why=_short(left, out, min_nodes))
    return Decision(True, left, out, take=take)


def settle(d: Decision, joined: list[str], gone: dict[str, str], policy: Policy) -> Decision:
    """D once its spares were tried: those JOINED are in; GONE (node -> why: D's quarantined
    nodes and the spares that could not join) names what is missing when too few are left."""
    d.nodes = d.nodes + [n for n in joined if n not in d.nodes]
    if d.relaunch and len(d.nodes) < policy.min_nodes:
        d.relaunch, d.why = False, _short(d.nodes, gone, policy.min_nodes)
    return d


def _short(left: list[str], gone: dict[str, str], min_nodes: int) -> str:
    return f"{len(left)} node(s) left, --min-nodes {min_nodes}: " + "; ".join(
        f"{n}: {w}" for n, w in gone.items()
    )
