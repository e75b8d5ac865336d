"""The node's network: IPv4 addresses per interface, the route to an address, and whether a TCP
port is taken."""

from __future__ import annotations

import shlex

from nodeprep.engine.facts.probe import Fact


def _interfaces(text, rc):
    """IPv4 addresses per interface, from `ip -o -4 addr show` (or `hostname -I`)."""
    lines = text.strip().splitlines()
    if lines and lines[0] == "NO_IP":
        return {"?": " ".join(lines[1:]).split()}
    ifs: dict[str, list[str]] = {}
    for line in lines:
        f = line.split()
        if len(f) >= 4 and f[2] == "inet":
            ifs.setdefault(f[1].split("@")[0], []).append(f[3].split("/")[0])
    return ifs


INTERFACES = Fact(
    "interfaces",
    lambda _v: "ip -o -4 addr show 2>/dev/null || {\n  echo NO_IP\n  hostname -I\n}",
    _interfaces,
)


def primary_address(ifs: dict[str, list[str]]) -> str | None:
    for name, addrs in ifs.items():
        if name != "lo" and addrs:
            return addrs[0]
    return None


def _port(text: str, rc: int) -> bool:
    return bool(text.strip())


# PORT_LISTENING(29500): is something listening on that TCP port?
PORT_LISTENING = Fact(
    "port_listening", lambda port: f"ss -Hltn 'sport = :{int(port)}' 2>/dev/null", _port
)


def _route_script(addr) -> str:
    """`ip route get` to ADDR (a name is resolved on the node first, as NCCL would)."""
    q = shlex.quote(str(addr))
    return (
        f"a={q}\n"
        "case $a in *[!0-9.]*) a=$(getent ahostsv4 \"$a\" | awk 'NR==1 {print $1}');; esac\n"
        '[ -n "$a" ] && ip -o route get "$a" 2>/dev/null || echo NOROUTE'
    )


def _route(text: str, rc: int) -> dict | None:
    """{'dev', 'src', 'local'} of `ip -o route get` (None: no route); `local` when the address
    is this node's own (dev is then lo, and src names the address)."""
    f = text.split()
    if not f or f[0] == "NOROUTE" or "dev" not in f:
        return None
    after = lambda k: f[f.index(k) + 1] if k in f and f.index(k) + 1 < len(f) else None
    return {"dev": after("dev"), "src": after("src"), "local": f[0] == "local"}


# ROUTE(address): the interface this node reaches ADDRESS through
ROUTE = Fact("route", _route_script, _route)


def reaching(ifs: dict[str, list[str]], route: dict | None) -> str | None:
    """The interface a node uses to reach an address: the route's device, or for its own
    address the interface that holds it."""
    if not route:
        return None
    if route["local"]:
        return next((n for n, addrs in ifs.items() if route["src"] in addrs and n != "lo"), None)
    return route["dev"]
