"""Facts: a POSIX sh snippet plus a parser, composed into ONE probe per node per phase.

`probe_script` joins the snippets of the facts asked for, each section fenced by a marker
carrying a random token (so no remote output can forge a section), runs as one remote
command, and `split_sections` hands each parser only its own text and exit status. Roles
register more facts with `@fact(...)`; the engine never imports a role.
"""
from __future__ import annotations

import secrets
import shlex
from dataclasses import dataclass, replace
from typing import Any, Callable

from . import gpus
from .errors import NodeprepError


@dataclass(frozen=True)
class Fact:
    name: str
    script: Callable[[dict], str]     # host vars -> sh snippet (values quoted by the fact)
    parse: Callable[[str, int], Any]  # (section text, exit status) -> value
    doc: str = ""
    # Optional: ONE snippet for many arguments of this fact (list of args -> sh), and its
    # reader ((text, rc, args) -> one value per argument). Every exec on a node costs ~1 ms
    # of CPU; reading 6 files one by one cost 25 of them.
    batch: Callable[[list], str] | None = None
    split: Callable[[str, int, list], list] | None = None
    private: bool = False   # its output may carry secrets (file contents): never quoted in errors


FACTS: dict[str, Fact] = {}


def fact(name: str, script: str | Callable[[dict], str], private: bool = False):
    """Register a parser as fact NAME; SCRIPT is sh text or a function of the host vars."""
    def deco(parse):
        run = script if callable(script) else (lambda _v, s=script: s)
        FACTS[name] = Fact(name, run, parse, (parse.__doc__ or "").strip(), private=private)
        return parse
    return deco


def batched(name: str, batch: Callable[[list], str], split: Callable[[str, int, list], list]):
    """Give fact NAME a batch form: all its parametrized requests of one probe share a section."""
    FACTS[name] = replace(FACTS[name], batch=batch, split=split)


def _key(req) -> str:
    return req if isinstance(req, str) else f"{req[0]}:{req[1]}"


def _plan(requests: list, host_vars: dict) -> list[tuple[str, str, list[tuple[int, Any]]]]:
    """Sections of a probe: (tag, fact name, [(request index, argument)]). A batchable fact's
    parametrized requests share one section, placed where the first of them stood."""
    out: list = []
    shared: dict[str, list] = {}
    for i, req in enumerate(requests):
        name, arg = (req, host_vars) if isinstance(req, str) else req
        if FACTS[name].batch and not isinstance(req, str):
            if name not in shared:
                shared[name] = []
                out.append((f"b.{name}", name, shared[name]))
            shared[name].append((i, arg))
        else:
            out.append((str(i), name, [(i, arg)]))
    return out


def section_tags(requests: list) -> list[str]:
    """The section tags a probe of REQUESTS prints (for checking that it ran to the end)."""
    return [tag for tag, _n, _a in _plan(requests, {})]


def probe_script(requests: list, host_vars: dict, token: str) -> str:
    """REQUESTS: fact names, or (name, argument) pairs for parametrized facts such as
    ("file", "~/.ssh/config"); a plain name's snippet gets the host vars."""
    parts = []
    for tag, name, items in _plan(requests, host_vars):
        f = FACTS[name]
        snippet = f.batch([a for _i, a in items]) if tag.startswith("b.") else f.script(items[0][1])
        # Each section runs in a subshell so one fact's `exit` or `cd` cannot leak into the next.
        parts.append(f"echo '@@{token}:{tag}@@'\n( {snippet}\n) 2>&1 </dev/null\n"
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
    for tag, name, items in _plan(requests, {}):
        keys = [_key(requests[i]) for i, _a in items]
        key = ", ".join(keys) if len(keys) < 3 else f"{name} ({len(keys)} of them)"
        if tag not in sections:
            raise NodeprepError(f"fact probe on {session_name} ended before '{key}' "
                                f"(exit {rc}): {tail or 'no output'}")
        text, frc = sections[tag]
        try:
            if tag.startswith("b."):
                got = FACTS[name].split(text, frc, [a for _i, a in items])
                if len(got) != len(keys):
                    raise ValueError(f"{len(got)} answers for {len(keys)} requests")
                values.update(zip(keys, got))
            else:
                values[key] = FACTS[name].parse(text, frc)
        except (ValueError, KeyError, IndexError) as e:
            shown = "" if FACTS[name].private else f"; output was: {text.strip()[:200]!r}"
            raise NodeprepError(f"cannot read fact '{key}' on {session_name}: {e}{shown}") from None
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


@fact("login_shell", "getent passwd \"$(id -un)\"")
def _login_shell(text, rc):
    """Field 7 of the user's passwd entry (cut on the controller: one exec less per node)."""
    f = text.strip().splitlines()[-1].split(":") if text.strip() else []
    return (f[6] or None) if len(f) >= 7 else None


@fact("python_on_path", "command -v python || true")
def _python_on_path(text, rc):
    """What `python` a launcher's non-interactive ssh shell runs: the probe's sh inherits the
    PATH the user's login shell set up for this very ssh command, so no second round trip."""
    lines = [ln for ln in text.strip().splitlines() if ln.startswith("/")]
    return lines[-1] if lines else None


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


@fact("user", "LC_ALL=C id; printf '%s\\n' \"$HOME\"")
def _user(text, rc):
    """Name, uid and home, from one `id` (POSIX format `uid=N(name) ...`), not two."""
    import re
    idline, home = text.strip().splitlines()[:2]
    m = re.match(r"uid=(\d+)(?:\(([^)]*)\))?", idline)
    if not m:
        raise ValueError(f"unexpected `id` output {idline[:80]!r}")
    return {"name": m.group(2) or m.group(1), "uid": int(m.group(1)), "home": home}

