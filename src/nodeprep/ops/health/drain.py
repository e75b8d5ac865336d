"""`invoke health --drain / --undrain`: what to tell Slurm about each node, decided from the
health verdicts and what Slurm says of the node (state and reason), as data.

The rule (LBNL NHC's, with Slurm's HealthCheckProgram: a tagged reason is the node's owner):
  - --drain: a node with a CRITICAL finding is drained with the reason `nodeprep: CODE,...`;
    one already drained by nodeprep gets the current codes; one drained or down for a reason
    someone else wrote is left as it is (their reason stays: nodeprep never overwrites it).
  - --undrain: a node drained with a reason starting `nodeprep:` and now without a CRITICAL
    finding is returned to service (State=RESUME); one still CRITICAL stays drained; a node
    drained by anyone else is never touched.
Nothing else changes: without --drain/--undrain this module is not used."""

from __future__ import annotations

import shlex
from dataclasses import KW_ONLY, dataclass

PREFIX = "nodeprep:"
# `sinfo -N` prints a node once per partition; %T: its state (drained, draining, down+drain ...),
# %E: the reason as written (without Slurm's [user@time] suffix). The reason is last: it may
# hold the separator.
STATE = "sinfo -h -N -o '%N|%T|%E'"


@dataclass(frozen=True)
class SlurmNode:
    state: str  # %T as sinfo printed it, lower case
    reason: str  # "none" when no reason is set (sinfo's word for it)

    @property
    def drained(self) -> bool:
        return "drain" in self.state

    @property
    def ours(self) -> bool:
        return self.reason.startswith(PREFIX)


@dataclass(frozen=True)
class Action:
    node: str  # inventory name
    slurm: str  # Slurm NodeName
    op: str  # drain | resume | keep
    _: KW_ONLY
    why: str
    reason: str = ""  # the reason written with drain

    def command(self) -> str:
        """The scontrol command, every value a single literal argument."""
        if self.op == "drain":
            return (
                f"scontrol update NodeName={shlex.quote(self.slurm)} State=DRAIN "
                f"Reason={shlex.quote(self.reason)}"
            )
        if self.op == "resume":
            return f"scontrol update NodeName={shlex.quote(self.slurm)} State=RESUME"
        return ""


def parse_state(text: str) -> dict[str, SlurmNode]:
    """{Slurm node: SlurmNode} from STATE's output (a node in several partitions: once)."""
    out: dict[str, SlurmNode] = {}
    for line in text.splitlines():
        f = line.strip().split("|", 2)
        if len(f) == 3 and f[0] and f[0] not in out:
            out[f[0]] = SlurmNode(f[1].strip().lower(), f[2].strip())
    return out


def reason(codes) -> str:
    """The reason nodeprep writes: its prefix and the CRITICAL codes (stable, ours: no value
    from a node or an inventory reaches it)."""
    return f"{PREFIX} {','.join(sorted(set(codes)))} (invoke health)"


def _drain(node: str, name: str, st: SlurmNode, codes: list[str]) -> Action:
    """What --drain does to NODE (Slurm's NAME, in state ST) with CRITICAL CODES: drain it,
    unless it is drained already (by someone else, or by nodeprep for the same codes)."""
    want = reason(codes)
    if st.drained and not st.ours:
        return Action(
            node,
            name,
            "keep",
            why=f"already drained by someone else (reason {st.reason!r}): left as it is",
        )
    elif st.drained and st.reason == want:
        return Action(node, name, "keep", why="already drained by nodeprep for the same codes")
    else:
        return Action(
            node,
            name,
            "drain",
            why=f"CRITICAL: {', '.join(sorted(set(codes)))}",
            reason=want,
        )


def actions_for(
    critical: dict[str, list[str]],
    nodes: list[str],
    slurm_names: dict[str, str],
    states: dict[str, SlurmNode],
    drain: bool,
    undrain: bool,
) -> list[Action]:
    """One Action per node where something is (or is deliberately not) done. CRITICAL: {node:
    its CRITICAL codes}; NODES: the nodes health looked at, in order; SLURM_NAMES: {node: Slurm
    NodeName}; STATES: parse_state's answer."""
    out = []
    for node in nodes:
        name = slurm_names.get(node)
        st = states.get(name) if name else None
        if st is None:
            if (drain and node in critical) or undrain:
                out.append(
                    Action(
                        node, name or "", "keep", why="Slurm does not list this node: nothing done"
                    )
                )
            continue
        codes = critical.get(node)
        if codes and drain:
            out.append(_drain(node, name, st, codes))
        elif codes and undrain and st.drained and st.ours:
            out.append(Action(node, name, "keep", why="still CRITICAL: stays drained"))
        elif not codes and undrain and st.drained and st.ours:
            out.append(
                Action(node, name, "resume", why=f"healthy now (was drained: {st.reason!r})")
            )
        elif not codes and undrain and st.drained:
            out.append(
                Action(
                    node,
                    name,
                    "keep",
                    why=f"drained by someone else (reason {st.reason!r}): "
                    "never undrained by nodeprep",
                )
            )
    return out


DENIED = ("ermission denied", "ccess/permission denied", "nvalid user id", "not authorized")


def script(action: Action) -> str:
    """The head runs ACTION's scontrol command; when Slurm refuses the user (only root, the
    SlurmUser and Slurm operators may drain) it tries once more through `sudo -n`."""
    cmd = action.command()
    denied = "|".join(f"*{d}*" for d in DENIED).replace(" ", "\\ ")
    return (
        f'out=$({cmd} 2>&1) && exit 0; case "$out" in {denied}) '
        f"sudo -n {cmd} && exit 0;; esac; printf '%s\\n' \"$out\" >&2; exit 1"
    )
