"""What a host's name, address, user and port, and every variable's text, may contain.

A host's name becomes an ssh config `Host` alias, a pdsh/mpirun/hostfile word and a file name
under the run directory; its address a `HostName`; its user a `User` and an ssh `-l`. Each is
checked when the inventory is read, so a bad one is one line naming file:line (exit 2) before
anything runs, never a traceback later or a command on a node:

  name     a hostname (letters, digits, '-', '_', dot-separated labels of at most 63, 253 in
           all, not starting with '-') or an IP literal (IPv6 included)
  address  the same, IPv6 with an optional %zone (fe80::1%eth0)
  user     a POSIX user name (letters, digits, '.', '_', '-', not starting with '-'), '@' allowed
           for directory users (jdoe@corp.example.com); at most 256
  port     1..65535 (a `host:PORT` key included)
  any text of a variable nodeprep uses: no control character (newline, NUL, escape...) and at
           most MAX_TEXT characters. Per-consumer rules (what DeepSpeed's pdsh runner cannot carry,
           paths of the shell role) are the roles' `validate`.
"""

from __future__ import annotations

import ipaddress
import re

from nodeprep.errors import InputError
from nodeprep.inventory.sources import split_origin

MAX_TEXT = 4096
_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]{0,255}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
ALIAS_HINT = (
    "use letters, digits, '-', '_' and dots (a DNS name or an IP address); no spaces, "
    "shell or ssh-config characters"
)


def _ip(text: str, zone: bool) -> bool:
    body, pct, scope = text.partition("%")
    if pct and not (zone and scope and re.fullmatch(r"[A-Za-z0-9_.-]{1,15}", scope)):
        return False
    try:
        addr = ipaddress.ip_address(body)
    except ValueError:
        return False
    return not pct or addr.version == 6


def _hostname(text: str) -> bool:
    name = text[:-1] if text.endswith(".") else text  # a rooted FQDN
    return (
        0 < len(name) <= 253
        and not name.startswith("-")
        and all(_LABEL.fullmatch(label) for label in name.split("."))
    )


def show(text: str) -> str:
    """TEXT for a one-line message: quoted, control characters escaped, cut at 60."""
    return repr(text if len(text) <= 60 else text[:57] + "...")


def name_problem(name: str) -> str | None:
    if _hostname(name) or _ip(name, zone=False):
        return None
    return _why(name, "host name")


def address_problem(address: str) -> str | None:
    if _hostname(address) or _ip(address, zone=True):
        return None
    return _why(address, "address")


def user_problem(user: str) -> str | None:
    if _USER.fullmatch(user) and not user.endswith("@"):
        return None
    if user.startswith("-"):
        return f"user {show(user)} starts with '-', which ssh would read as an option"
    return (
        f"user {show(user)} is not a user name (letters, digits, '.', '_', '-', '@'; at most "
        f"256; not starting with '-')"
    )


def _why(text: str, what: str) -> str:
    if text.startswith("-"):
        return f"{what} {show(text)} starts with '-', which ssh, pdsh and mpirun read as an option"
    bad = sorted({c for c in text if not (c.isascii() and (c.isalnum() or c in "._-"))})
    if len(text) > 253:
        return f"{what} {show(text)} is {len(text)} characters long (a hostname has at most 253)"
    if any(not c.isascii() for c in bad):
        return (
            f"{what} {show(text)} has non-ASCII characters: write an internationalised "
            f"name in its xn-- (punycode) form"
        )
    if set(bad) <= {":", "%"}:
        return f"{what} {show(text)} is not a valid IP address"
    if bad:
        return f"{what} {show(text)} contains {', '.join(repr(c) for c in bad)}"
    return f"{what} {show(text)} is not a hostname or IP address (a label is empty or too long)"


def text_problem(value) -> str | None:
    """Why a variable's value (strings inside lists and mappings too, keys included) cannot
    reach a node file or command; never echoes the value (it may be a secret)."""
    for text in _texts(value):
        m = _CONTROL.search(text)
        if m:
            return (
                f"contains the control character {m.group()!r} at position {m.start() + 1}: "
                f"values are single-line text (no newline, NUL, tab or escape)"
            )
        if len(text) > MAX_TEXT:
            return f"is {len(text)} characters long; at most {MAX_TEXT}"
    return None


def _texts(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _texts(key)
            yield from _texts(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _texts(item)


def split_where(where: str) -> tuple[str | None, int | None]:
    """sources.split_origin, with a value from the command line shown as `--set` and an origin
    without a line (a Slurm list) kept as it is."""
    if where == "cli":
        return "--set", None
    file, line = split_origin(where or "")
    return (file, line) if file else ((where or None), None)


def check_host(host, where: str) -> None:
    """Raise InputError for HOST's name (defined at WHERE), address, user, port or a used
    variable's text; the error points at the line that set the bad value."""
    problem = name_problem(host.name)
    if problem:
        raise InputError(problem, ALIAS_HINT, *split_where(where))
    if host.vars.get("address") == "":
        raise InputError(
            f"host {host.name}: address is empty",
            "remove the line to use the host's name, or give an address",
            *split_where(host.origin["address"]),
        )
    for var, why in (
        ("address", address_problem(host.address)),
        ("user", host.user is not None and user_problem(host.user)),
        ("port", _port_problem(host.port)),
    ):
        if why:
            origin = host.origin.get(var, where)
            raise InputError(f"host {host.name}: {why}", _hint(var, origin), *split_where(origin))
    for hop in host.jump:  # a hop reaches an ssh config: literally or not at all
        why = address_problem(hop.address) or (hop.user is not None and user_problem(hop.user))
        if why:
            var = next(
                (
                    v
                    for v in (
                        "proxy_jump",
                        "ansible_ssh_common_args",
                        "ansible_ssh_extra_args",
                        "proxyjump",
                        "proxycommand",
                    )
                    if v in host.origin
                ),
                "proxy_jump",
            )
            raise InputError(
                f"host {host.name}: jump host {hop}: {why}",
                "give [user@]host[:port]",
                *split_where(host.origin.get(var, where)),
            )
    for var, value in host.vars.items():
        why = text_problem(value)
        if why:
            origin = host.origin.get(var, where)
            raise InputError(
                f"host {host.name}: {var} {why}",
                "fix the value" if origin != "cli" else "fix the --set value",
                *split_where(origin),
            )


def _port_problem(port) -> str | None:
    if isinstance(port, int) and not isinstance(port, bool) and 1 <= port <= 65535:
        return None
    return f"port {port!r} is not 1..65535"


def _hint(var: str, origin: str) -> str:
    flag = " (given with --set)" if origin == "cli" else ""
    return {
        "address": f"give an IP address or DNS name{flag}",
        "user": f"give the login name only{flag}",
        "port": f"give a port number 1..65535{flag}",
    }[var]
