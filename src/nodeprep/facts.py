"""Facts: a POSIX sh snippet plus a parser, composed into ONE probe per node per phase.

`probe_script` joins the snippets of the facts asked for, each section fenced by a marker
carrying a random token (so no remote output can forge a section), runs as one remote
command, and `split_sections` hands each parser only its own text and exit status. Roles
register more facts with `@fact(...)`; the engine never imports a role.
"""
from __future__ import annotations

import secrets
import shlex
from dataclasses import dataclass
from typing import Any, Callable

from . import gpus
from .errors import NodeprepError


@dataclass(frozen=True)
class Fact:
    name: str
    script: Callable[[dict], str]     # host vars -> sh snippet (values quoted by the fact)
    parse: Callable[[str, int], Any]  # (section text, exit status) -> value
    doc: str = ""


FACTS: dict[str, Fact] = {}


def fact(name: str, script: str | Callable[[dict], str]):
    """Register a parser as fact NAME; SCRIPT is sh text or a function of the host vars."""
    def deco(parse):
        run = script if callable(script) else (lambda _v, s=script: s)
        FACTS[name] = Fact(name, run, parse, (parse.__doc__ or "").strip())
        return parse
    return deco


def _key(req) -> str:
    return req if isinstance(req, str) else f"{req[0]}:{req[1]}"


def probe_script(requests: list, host_vars: dict, token: str) -> str:
    """REQUESTS: fact names, or (name, argument) pairs for parametrized facts such as
    ("file", "~/.ssh/config"); a plain name's snippet gets the host vars."""
    parts = []
    for i, req in enumerate(requests):
        name, arg = (req, host_vars) if isinstance(req, str) else req
        # Each section runs in a subshell so one fact's `exit` or `cd` cannot leak into the next.
        parts.append(f"echo '@@{token}:{i}@@'\n( {FACTS[name].script(arg)}\n) 2>&1 </dev/null\n"
                     f"echo \"@@{token}:rc=$?@@\"")
    return "\n".join(parts) + "\n"


def split_sections(output: str, token: str) -> dict[str, tuple[str, int]]:
    out: dict[str, tuple[str, int]] = {}
    name, buf = None, []
    for line in output.splitlines():
        if line.startswith(f"@@{token}:") and line.endswith("@@"):
            tag = line[len(token) + 3:-2]
            if tag.startswith("rc="):
                if name is not None:
                    out[name] = ("\n".join(buf), int(tag[3:]))
                name, buf = None, []
            else:
                name, buf = tag, []
        elif name is not None:
            buf.append(line)
    return out


def parse_sections(session_name: str, requests: list, output: str, token: str, rc: int,
                   tail: str = "") -> dict[str, Any]:
    sections = split_sections(output, token)
    values = {}
    for i, req in enumerate(requests):
        key = _key(req)
        name = req if isinstance(req, str) else req[0]
        if str(i) not in sections:
            raise NodeprepError(f"fact probe on {session_name} ended before '{key}' "
                                f"(exit {rc}): {tail or 'no output'}")
        text, frc = sections[str(i)]
        try:
            values[key] = FACTS[name].parse(text, frc)
        except (ValueError, KeyError, IndexError) as e:
            raise NodeprepError(f"cannot read fact '{key}' on {session_name}: {e}; output was: "
                                f"{text.strip()[:200]!r}") from None
    return values


def gather(session, requests: list, host_vars: dict | None = None) -> dict[str, Any]:
    """One round trip to the node for all REQUESTS; returns {key: parsed value} where key is
    the fact name, or "name:argument" for parametrized facts."""
    token = secrets.token_hex(6)
    label = "probe " + ",".join(_key(r) for r in requests)
    r = session.run(probe_script(requests, host_vars or {}, token), label=label[:300],
                    log_output=False)
    return parse_sections(session.name, requests, r.stdout, token, r.rc, r.tail(3))


# -- the node facts `invoke facts` shows ------------------------------------------------------

@fact("hostname", "hostname")
def _hostname(text, rc):
    return text.strip()


@fact("os", ". /etc/os-release 2>/dev/null && printf '%s\\n' \"$PRETTY_NAME\"; uname -srm")
def _os(text, rc):
    """OS release name, kernel name, kernel release, machine (CPU architecture)."""
    lines = text.strip().splitlines()
    system, kernel, arch = lines[-1].split()
    return {"release": lines[0] if len(lines) > 1 else system, "kernel": kernel, "arch": arch}


@fact("interfaces", "ip -o -4 addr show 2>/dev/null || { echo NO_IP; hostname -I; }")
def interfaces(text, rc):
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


@fact("python", lambda v: (
    f"p=$(command -v {shlex.quote(str(v.get('python') or 'python3'))}) || "
    # -I -S: no site import, so the probe costs a third of a plain start.
    "{ echo MISSING; exit 0; }; \"$p\" -I -S -c 'import os, sys; "
    "print(sys.executable); print(\"%d.%d.%d\" % sys.version_info[:3]); "
    "print(os.confstr(\"CS_GNU_LIBC_VERSION\") or \"-\")'"))
def _python(text, rc):
    """The inventory's interpreter: resolved path, version, glibc (None when missing)."""
    lines = text.strip().splitlines()
    if not lines or lines[0] == "MISSING" or rc != 0:
        return None
    path, version, libc = lines[-3:]
    return {"path": path, "version": version,
            "glibc": libc.split()[-1] if libc.startswith("glibc") else None}


@fact("login_shell", "getent passwd \"$(id -un)\" | cut -d: -f7")
def _login_shell(text, rc):
    return text.strip() or None


@fact("disk_free", "df -Pk \"$HOME\" | awk 'NR==2 {print $4}'")
def _disk_free(text, rc):
    """Free bytes on the file system holding the home directory."""
    return int(text.strip()) * 1024


@fact("gpus", gpus.PROBE)
def _gpus(text, rc):
    return gpus.parse(text)


def node_facts() -> list[str]:
    return ["hostname", "os", "interfaces", "python", "login_shell", "disk_free", "gpus"]


def primary_address(ifs: dict[str, list[str]]) -> str | None:
    for name, addrs in ifs.items():
        if name != "lo" and addrs:
            return addrs[0]
    return None


@fact("etc_shells", "cat /etc/shells 2>/dev/null")
def _etc_shells(text, rc):
    """Login shells the node allows."""
    return [ln.strip() for ln in text.splitlines() if ln.strip().startswith("/")]


@fact("user", "id -un; id -u; printf '%s\\n' \"$HOME\"")
def _user(text, rc):
    name, uid, home = text.strip().splitlines()[:3]
    return {"name": name, "uid": int(uid), "home": home}

