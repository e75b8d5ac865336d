"""First contact's connection checks, for `invoke doctor`: `reach`, `auth` and `host_key` say
why a node was not reached (or how it was), each finding with the command that fixes it; a
failure about a jump host names the jump host. Pure functions of every node's `Contact`
(node.py), returning (node, code, verdict, reason, fix) tuples."""

from __future__ import annotations

import re

from nodeprep.ops.doctor.node import Contact
from nodeprep.ops.health.findings import Verdict


def _jump(message: str) -> str | None:
    """The jump host a connection failure is about ("... the jump host ops@10.0.0.5:2222 ..."),
    None when it is about the node itself."""
    m = re.search(r"the jump host (\S+)", message)
    return m.group(1).rstrip(":") if m else None


def _hop_address(hop: str) -> str:
    rest = hop.rpartition("@")[2]
    return rest.rsplit(":", 1)[0] if rest.count(":") == 1 else rest.strip("[]")


def _copy_id_target(hop: str) -> str:
    """ssh-copy-id's arguments for a hop written user@host:port (it takes -p, not host:port)."""
    user, at, rest = hop.rpartition("@")
    port = rest.rsplit(":", 1)[1] if rest.count(":") == 1 else None
    return (f"-p {port} " if port else "") + (f"{user}@" if at else "") + _hop_address(hop)


def reach(contacts: list[Contact]) -> list:
    out = []
    for c in contacts:
        if c.reached:
            out.append((c.name, "REACHED", Verdict.OK, f"{c.address}:{c.port} answers", ""))
        elif c.error_kind not in ("AuthFailed", "HostKeyChanged", "UnknownHostKey"):
            out.append(
                (
                    c.name,
                    "NODE_UNREACHABLE",
                    Verdict.CRITICAL,
                    c.message,
                    f"start the node or fix its address, check with `ssh -v -p {c.port} "
                    f"{(c.user + '@') if c.user else ''}{c.address} true`; "
                    f"or leave it out: --limit '!{c.name}'",
                )
            )
    return out


def auth(contacts: list[Contact]) -> list:
    out = []
    for c in contacts:
        if c.error_kind == "AuthFailed":
            key, hop = c.key or "~/.ssh/id_ed25519", _jump(c.message)
            target = (
                _copy_id_target(hop)
                if hop
                else f"-p {c.port} {(c.user + '@') if c.user else ''}{c.address}"
            )
            out.append(
                (
                    c.name,
                    "AUTH_FAILED",
                    Verdict.CRITICAL,
                    c.message,
                    f"ssh-copy-id -i {key}.pub {target}  (or fix user/key in the inventory)",
                )
            )
        elif c.reached and c.login.get("method") == "password":
            out.append(
                (
                    c.name,
                    "AUTH_PASSWORD",
                    Verdict.WARN,
                    "logged in with a password: the launchers cannot type it",
                    f"ssh-copy-id -p {c.port} {(c.user + '@') if c.user else ''}{c.address}",
                )
            )
        elif c.reached:
            how = c.login.get("method") or "?"
            out.append(
                (
                    c.name,
                    "AUTH_OK",
                    Verdict.OK,
                    how + (f" with {c.key}" if c.key and how == "publickey" else ""),
                    "",
                )
            )
    return out


def host_key(contacts: list[Contact]) -> list:
    out = []
    for c in contacts:
        if c.error_kind == "HostKeyChanged":
            hop = _jump(c.message)
            who = _hop_address(hop) if hop else c.name
            out.append(
                (
                    c.name,
                    "HOST_KEY_CHANGED",
                    Verdict.CRITICAL,
                    c.message,
                    f"compare with `ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` on the "
                    f"{'jump host' if hop else 'node'}'s console; if it was reinstalled: "
                    f"invoke hosts.forget {who}{c.inventory}",
                )
            )
        elif c.error_kind == "UnknownHostKey":
            out.append(
                (
                    c.name,
                    "HOST_KEY_UNPINNED",
                    Verdict.WARN,
                    c.message,
                    "check the fingerprint on the node, then allow first-contact pinning "
                    "(nodeprep.pin_new_host_keys: true)",
                )
            )
        elif c.reached and c.login.get("host_key"):
            new = " (pinned now: first contact)" if c.login.get("pinned_now") else ""
            out.append((c.name, "HOST_KEY_PINNED", Verdict.OK, f"{c.login['host_key']}{new}", ""))
        elif c.reached:
            out.append((c.name, "HOST_KEY_LOCAL", Verdict.OK, "the controller itself (no ssh)", ""))
    return out
