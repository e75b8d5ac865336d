"""Facts: a POSIX sh snippet plus a parser, composed into ONE probe per node per phase.

A `Fact` is an object the code refers to directly (`USER`, `FILE("~/.ssh/config")`); there is
no registry to look names up in. `probe_script` joins the snippets of the requests asked for,
each section fenced by a marker carrying a random token (so no remote output can forge a
section), runs as one remote command, and `parse_sections` hands each parser only its own text
and exit status. The answers come back as `FactValues`, a dict that takes a request object (or
its string key, "user", "file:~/.ssh/config") as the key.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any, Callable

from nodeprep.errors import NodeprepError


@dataclass(frozen=True, eq=False)
class Fact:
    """NAME is only for keys and messages. COMMAND: the sh snippet, a function of the request's
    argument (a parametrized fact) or of the host vars (a plain fact); values are quoted by
    the fact. PARSE: (section text, exit status) -> value."""

    name: str
    command: Callable[[Any], str]
    parse: Callable[[str, int], Any]
    # Optional: ONE snippet for many arguments of this fact (list of args -> sh), and its
    # reader ((text, rc, args) -> one value per argument). Every exec on a node costs ~1 ms
    # of CPU; reading 6 files one by one cost 25 of them.
    batch: Callable[[list], str] | None = None
    split: Callable[[str, int, list], list] | None = None
    private: bool = False  # its output may carry secrets (file contents): never quoted in errors
    # (host vars, snippet) -> the snippet as it runs on that node: modules.with_modules for
    # the facts that run the venv's python, which on a node naming `modules` run with them
    # loaded, as the ranks' shells have them, whether or not the env file's block that loads
    # them is there yet (a module's Python may not start without its LD_LIBRARY_PATH)
    wrap: Callable[[dict, str], str] | None = None

    def __call__(self, arg) -> "Request":
        return Request(self, arg)

    @property
    def key(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"Fact({self.name})"


@dataclass(frozen=True)
class Request:
    """A parametrized fact with its argument, e.g. FILE("~/.ssh/config"). str(arg) names it."""

    fact: Fact
    arg: Any

    @property
    def key(self) -> str:
        return f"{self.fact.name}:{self.arg}"


def key_of(req) -> str:
    return req if isinstance(req, str) else req.key


class FactValues(dict):
    """{key: parsed value}; indexable by the request objects themselves."""

    def __getitem__(self, k):
        return super().__getitem__(key_of(k))

    def __contains__(self, k):
        return super().__contains__(key_of(k))

    def get(self, k, default=None):
        return super().get(key_of(k), default)


def _sections(requests: list, host_vars: dict) -> list[tuple[str, Fact, list[tuple[int, Any]]]]:
    """Sections of a probe: (tag, fact, [(request index, argument)]). A batchable fact's
    parametrized requests share one section, placed where the first of them stood."""
    out: list = []
    shared: dict[str, list] = {}
    for i, req in enumerate(requests):
        if not isinstance(req, (Fact, Request)):
            raise TypeError(
                f"fact request {req!r}: give a Fact or a Request (nodeprep.engine.facts)"
            )
        fact, arg = (req, host_vars) if isinstance(req, Fact) else (req.fact, req.arg)
        if fact.batch and isinstance(req, Request):
            if fact.name not in shared:
                shared[fact.name] = []
                out.append((f"b.{fact.name}", fact, shared[fact.name]))
            shared[fact.name].append((i, arg))
        else:
            out.append((str(i), fact, [(i, arg)]))
    return out


def section_tags(requests: list) -> list[str]:
    """The section tags a probe of REQUESTS prints (for checking that it ran to the end)."""
    return [tag for tag, _f, _a in _sections(requests, {})]


def probe_script(requests: list, host_vars: dict, token: str) -> str:
    """REQUESTS: Fact objects (their snippet gets the host vars) or Requests such as
    FILE("~/.ssh/config")."""
    parts = []
    for tag, fact, items in _sections(requests, host_vars):
        snippet = (
            fact.batch([a for _i, a in items])
            if tag.startswith("b.")
            else fact.command(items[0][1])
        )
        if fact.wrap:
            snippet = fact.wrap(host_vars, snippet)
        # Each section runs in a subshell so one fact's `exit` or `cd` cannot leak into the next.
        parts.append(
            f"echo '@@{token}:{tag}@@'\n( {snippet}\n) 2>&1 </dev/null\necho \"@@{token}:rc=$?@@\""
        )
    return "\n".join(parts) + "\n"


def split_sections(output: str, token: str) -> dict[str, tuple[str, int]]:
    out: dict[str, tuple[str, int]] = {}
    name, buf = None, []
    for line in output.splitlines():
        if line.startswith(f"@@{token}:") and line.endswith("@@"):
            tag = line[len(token) + 3 : -2]
            if tag.startswith("rc="):
                if name is not None:
                    out[name] = ("\n".join(buf), int(tag[3:]))
                name, buf = None, []
            else:
                name, buf = tag, []
        elif name is not None:
            buf.append(line)
    return out


def parse_sections(
    node: str, requests: list, output: str, token: str, rc: int, tail: str = ""
) -> FactValues:
    sections = split_sections(output, token)
    values = FactValues()
    for tag, fact, items in _sections(requests, {}):
        keys = [key_of(requests[i]) for i, _a in items]
        key = ", ".join(keys) if len(keys) < 3 else f"{fact.name} ({len(keys)} of them)"
        if tag not in sections:
            raise NodeprepError(
                f"fact probe on {node} ended before '{key}' (exit {rc}): {tail or 'no output'}"
            )
        text, frc = sections[tag]
        try:
            if tag.startswith("b."):
                got = fact.split(text, frc, [a for _i, a in items])
                if len(got) != len(keys):
                    raise ValueError(f"{len(got)} answers for {len(keys)} requests")
                values.update(zip(keys, got))
            else:
                values[key] = fact.parse(text, frc)
        except (ValueError, KeyError, IndexError) as e:
            shown = "" if fact.private else f"; output was: {text.strip()[:200]!r}"
            raise NodeprepError(f"cannot read fact '{key}' on {node}: {e}{shown}") from None
    return values


def gather(
    session, requests: list, host_vars: dict | None = None, timeout: float | None = None
) -> FactValues:
    """One round trip to the node for all REQUESTS; returns their values. TIMEOUT: the
    probe's limit (default: the settings' probe_timeout)."""
    token = secrets.token_hex(6)
    label = "probe " + ",".join(key_of(r) for r in requests)
    r = session.run(
        probe_script(requests, host_vars or {}, token),
        label=label[:300],
        timeout=timeout or session.settings.probe_timeout,
        log_output=False,
    )
    return parse_sections(session.name, requests, r.stdout, token, r.rc, r.tail(3))


def json_document(text: str) -> dict | None:
    """The JSON object a tool printed (dcgmi -j, iperf3 -J), after whatever text came before
    it (a warning line); None when there is none."""
    start = text.find("{")
    try:
        doc = json.loads(text[start:]) if start >= 0 else None
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None
