"""Jump hosts (bastions) from every place users write them, as one chain of hops per host:

  proxy_jump: user@bastion:2222            nodeprep's own variable (a comma list is a chain,
                                           as OpenSSH's ProxyJump; a YAML list too)
  ansible_ssh_common_args / ansible_ssh_extra_args: '-o ProxyJump=...', '-J ...',
                                           '-o ProxyCommand="ssh -W %h:%p ..."'
  ProxyJump / ProxyCommand in ~/.ssh/config (sshconfig: and aliases, as `ssh -G` gives them)

A hop is OpenSSH's `[user@]host[:port]` or `ssh://[user@]host[:port]`. A ProxyCommand is
honoured where it is a plain hop (`ssh -W %h:%p [-p PORT] [-l USER] [USER@]HOST`, `-q` and
`-o`-less), else refused in one line naming the form nodeprep accepts. Pure: text in, hops
out."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

SSH_ARGS = ("ansible_ssh_common_args", "ansible_ssh_extra_args", "ansible_ssh_args")
ACCEPTED = (
    "ProxyJump [user@]host[:port][,...], or ProxyCommand 'ssh -W %h:%p [-p PORT] "
    "[-l USER] [user@]host'"
)


class Unsupported(Exception):
    """A jump form nodeprep cannot honour: VARIABLE and WHY (the reason and the form accepted)."""

    def __init__(self, variable: str, why: str):
        super().__init__(why)
        self.variable, self.why = variable, why


@dataclass(frozen=True)
class Hop:
    address: str
    port: int = 22
    user: str | None = None

    def __str__(self) -> str:
        return f"{self.user + '@' if self.user else ''}{self.address}" + (
            f":{self.port}" if self.port != 22 else ""
        )


def parse_hop(text: str) -> Hop:
    """One OpenSSH ProxyJump destination; ValueError when it is not one."""
    t = text.strip()
    if t.startswith("ssh://"):
        t = t[len("ssh://") :].rstrip("/")
    user, at, rest = t.rpartition("@")
    if not at:
        user, rest = "", t
    port = 22
    if rest.startswith("["):  # [v6]:port
        addr, _, tail = rest[1:].partition("]")
        if tail.startswith(":"):
            port = int(tail[1:])
    elif rest.count(":") == 1:
        addr, p = rest.split(":")
        port = int(p)
    else:
        addr = rest
    if not addr or any(c.isspace() for c in addr) or not 1 <= port <= 65535 or (at and not user):
        raise ValueError(text)
    return Hop(addr, port, user or None)


def parse_chain(text) -> tuple[Hop, ...]:
    """A ProxyJump value (or a list of hops): the hops in order; `none` is no jump."""
    items = text if isinstance(text, (list, tuple)) else str(text).split(",")
    if len(items) == 1 and str(items[0]).strip().lower() in ("none", ""):
        return ()
    return tuple(parse_hop(str(i)) for i in items)


def hop_of_command(command: str) -> Hop | None:
    """The hop a ProxyCommand amounts to, when it is a plain `ssh -W %h:%p ... HOST`."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    if not words or words[0].rsplit("/", 1)[-1] != "ssh":
        return None
    port = 22
    user = None
    host = None
    w_ok = False
    i = 1
    while i < len(words):
        w = words[i]
        if w == "-W" and i + 1 < len(words) and words[i + 1] in ("%h:%p", "[%h]:%p"):
            w_ok, i = True, i + 2
        elif w in ("-p", "-l") and i + 1 < len(words):
            if w == "-p":
                port = int(words[i + 1]) if words[i + 1].isdigit() else -1
            else:
                user = words[i + 1]
            i += 2
        elif w in ("-q", "-T", "-x", "-a", "-4", "-6"):
            i += 1
        elif not w.startswith("-") and host is None:
            host, i = w, i + 1
        else:
            return None
    if not w_ok or host is None or not 1 <= port <= 65535:
        return None
    try:
        hop = parse_hop(host)
    except ValueError:
        return None
    return Hop(hop.address, port if port != 22 else hop.port, user or hop.user)


def _from_args(text: str) -> tuple[str, str] | None:
    """('jump'|'command', value) when ssh arguments TEXT ask for a jump host."""
    try:
        words = shlex.split(text)
    except ValueError:
        words = text.split()
    i = 0
    while i < len(words):
        w = words[i]
        if w == "-J" and i + 1 < len(words):
            return "jump", words[i + 1]
        if w.startswith("-J") and len(w) > 2:
            return "jump", w[2:]
        if w == "-o" and i + 1 < len(words):
            opt, i = words[i + 1], i + 1
        elif w.startswith("-o") and len(w) > 2:
            opt = w[2:]
        else:
            i += 1
            continue
        key, _, value = opt.replace("=", " ", 1).partition(" ")
        if key.lower() == "proxyjump":
            return "jump", value.strip()
        if key.lower() == "proxycommand":
            return "command", value.strip()
        i += 1
    return None


def of_host(name: str, vars_: dict, extra: dict, origin: dict) -> tuple[Hop, ...]:
    """The jump chain of host NAME: `proxy_jump` first, then Ansible's ssh arguments, then
    the ssh config's ProxyJump / ProxyCommand. A form nodeprep cannot honour is an
    Unsupported naming the variable (the inventory still loads: the host is refused when a
    command selects it)."""

    def refuse(var: str, value, why: str):
        raise Unsupported(var, f"{var} {str(value)[:120]!r}: {why}; write {ACCEPTED}")

    found: list[tuple[str, str, object]] = []
    if vars_.get("proxy_jump") not in (None, "", []):
        found.append(("proxy_jump", "jump", vars_["proxy_jump"]))
    for var in SSH_ARGS:
        got = _from_args(str(extra.get(var) or ""))
        if got:
            found.append((var, *got))
    for var, kind in (("proxyjump", "jump"), ("proxycommand", "command")):
        value = extra.get(var)
        if value and str(value).lower() != "none":
            found.append((var, kind, value))
    if not found:
        return ()
    var, kind, value = found[0]
    if kind == "command":
        hop = hop_of_command(str(value))
        if hop is None:
            refuse(var, value, "a ProxyCommand other than a plain `ssh -W %h:%p` hop")
        return (hop,)
    try:
        return parse_chain(value)
    except ValueError:
        refuse(var, value, "not a jump host list")
