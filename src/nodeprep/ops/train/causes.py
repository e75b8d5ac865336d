"""The class of a failed run's root cause (issue 47): what `train --restarts` decides from, and
what the run's summary says. Pure: the root cause and the ranks' last lines as the rank watch
kept them (Outcome.root, Outcome.tails), no ssh.

Classes, first match wins:
- interrupted: Ctrl-C or train.stop. Never retried.
- timeout: the job's own --timeout. Not retried unless asked (--retry-on timeout).
- hardware: the NVIDIA driver's own sign of a failing GPU in the last lines of a rank that
  failed: an Xid line, an uncorrectable ECC error, a GPU fallen off the bus. The node of that
  rank is blamed. What NCCL says when a peer is gone (its watchdog timing a collective out,
  "unhandled system error") is said by the victims too, and a CUDA error may be the script's
  own kernel: neither blames a node.
- node: a node lost or silent (its watcher stopped answering), or a launcher whose ssh to a
  node failed (ssh's own words). That node is blamed.
- hang: no rank wrote a line or beat for --hang-timeout.
- user: the script's own error: a Python traceback in the failing rank's lines, or an exit
  status it chose (argparse's usage error is 2; above 128 a shell reports a signal). Not
  retried unless asked: the same code on the same data fails the same way.
- killed: a rank ended by a signal (the kernel's OOM killer included) or whose wrapper vanished,
  with no traceback: not the script's own doing. Its node is blamed only by the health gate.
- launcher: the launcher failed without naming a node (a bad option, a missing program).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

CLASSES = ("interrupted", "timeout", "hardware", "node", "hang", "user", "killed", "launcher")
MEANS = {
    "interrupted": "stopped by Ctrl-C or train.stop",
    "timeout": "the job's --timeout",
    "hardware": "a failing GPU or fabric",
    "node": "a node lost or unreachable",
    "hang": "no progress for --hang-timeout",
    "user": "the script's own error",
    "killed": "a rank killed by a signal, not by its script",
    "launcher": "the launcher itself failed",
}
RETRIED = frozenset({"hardware", "node", "hang", "killed"})  # --retry-on's default
NEVER = frozenset({"interrupted"})

# The NVIDIA driver's words for a failing GPU, as its kernel log lines read (tests/recordings/
# xid/: "NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus") and as CUDA reports an
# uncorrectable ECC error ("CUDA error: uncorrectable ECC error encountered")
HARDWARE = re.compile(
    r"NVRM: Xid \(|GPU has fallen off the bus|uncorrectable ECC error", re.IGNORECASE
)
TRACEBACK = "Traceback (most recent call last):"
# ssh's own words when it cannot reach a node (pdsh and mpirun relay them); a bare "Connection
# refused" is also torch's rendezvous talking, not a node lost
SSH_FAILED = re.compile(
    r"ssh: connect to host (\S+) port \d+: (?:Connection refused|Connection timed out"
    r"|No route to host)|ssh: Could not resolve hostname (\S+):"
    r"|(\S+): ssh exited with exit code 255"  # pdsh's own words, naming the host
)


@dataclass(frozen=True)
class Cause:
    klass: str  # one of CLASSES
    node: str | None  # the node blamed (None: none is)
    why: str  # one line: what showed it

    def retried(self, retry_on: frozenset[str] = RETRIED) -> bool:
        return self.klass not in NEVER and self.klass in retry_on

    def as_dict(self) -> dict:
        return {**asdict(self), "line": self.line}

    @property
    def line(self) -> str:
        """ "hardware on worker-1 (a failing GPU or fabric)"."""
        return f"{self.klass}{f' on {self.node}' if self.node else ''} ({MEANS[self.klass]})"


def node_of(who: str) -> str:
    """The node of a failure's `who`: "worker-1 r3" -> worker-1; a node or launcher label as is."""
    head, sep, rank = who.rpartition(" r")
    return head if sep and rank.isdigit() else who


def of_run(root: dict | None, tails: dict, addresses: dict | None = None) -> dict | None:
    """classify's answer as the run's Outcome keeps it (Cause.as_dict), None: no failure."""
    found = classify(root, tails, addresses)
    return found.as_dict() if found else None


def _first(pattern: re.Pattern, lines) -> str | None:
    return next((ln.strip() for ln in lines if pattern.search(ln)), None)


def classify(
    root: dict | None, tails: dict[str, list[str]], addresses: dict[str, str] | None = None
) -> Cause | None:
    """ROOT: the run's root cause (a rank watch Failure as a dict: kind, who, what, rank);
    TAILS: who -> its last lines; ADDRESSES: an address or alias ssh may name -> its node.
    None when the run did not fail."""
    if not root:
        return None
    kind, who, what = root.get("kind"), root.get("who") or "", root.get("what") or ""
    if kind in ("interrupted", "stopped"):
        return Cause("interrupted", None, what)
    if kind == "timeout":
        return Cause("timeout", None, what)
    # a hardware sign in any failing rank's lines: the root may be its peer's consequence
    for w in [who, *tails]:
        hit = _first(HARDWARE, tails.get(w) or ())
        if hit and w:
            return Cause("hardware", node_of(w), f"{node_of(w)}: {hit[:160]}")
    if kind == "node":
        return Cause("node", who, f"{who} {what}")
    if kind == "hang":
        return Cause("hang", None, what)
    mine = tails.get(who) or []
    if kind == "launcher":
        hit = _first(SSH_FAILED, mine)
        if hit:
            m = SSH_FAILED.search(hit)
            host = next((g for g in (m.groups() if m else ()) if g), None)
            return Cause("node", (addresses or {}).get(host, host), f"{who}: {hit[:160]}")
        return Cause("launcher", None, f"{who} {what}".strip())
    # a rank: its traceback, or an exit status it chose, is the script's; a signal, the OOM
    # killer or a wrapper gone is not
    status = re.match(r"exited with status (\d+)", what)
    if TRACEBACK in "\n".join(mine) or (status and int(status.group(1)) <= 128):
        last = next((ln.strip() for ln in reversed(mine) if ln.strip()), what)
        return Cause("user", None, f"{who} {what}: {last[:160]}")
    return Cause("killed", None, f"{who} {what}")
