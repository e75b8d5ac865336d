"""Deep-tier facts (`invoke health --deep`, minutes): what DCGM's diagnostic says (DCGM_DIAG)
and what the node's GPUs did under nodeside/gpudeep.py's burn and all_reduce (GPU_DEEP), read
as data. The checks that judge them are in ops/health/deep.py.

`dcgmi diag -j` prints tests under "test_categories" in both DCGM 3.x ("DCGM GPU Diagnostic",
display names, results keyed by "gpu_id"/"gpu_ids", a string or a number) and 4.x ("DCGM
Diagnostic", lower-case names, one result per entity: "entity_group", "entity_id"); a warning
is a {"warning", "error_id"} object (3.x's deployment tests: {"warnings", ...}); a warn is
printed as "Fail". Both are read by walking the document for objects with a test name and a
list of results, `null` entries and text before the JSON skipped (tests/recordings/dcgm/)."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from nodeprep import nodeside
from nodeprep.engine.facts.modules import with_modules
from nodeprep.engine.facts.probe import Fact, json_document
from nodeprep.engine.remote import rpath

DCGM_TIMEOUT = 900  # seconds: level 2 takes about 2 minutes, level 3 about 15 (DCGM docs)
_HUNG = (124, 137)


@dataclass(frozen=True)
class DcgmIn:
    level: int = 2

    def __str__(self) -> str:
        return f"r{self.level}"


def _dcgm_script(arg: DcgmIn) -> str:
    return (
        "command -v dcgmi >/dev/null 2>&1 || { echo @@absent; exit 0; }\n"
        f"timeout -k 10 {DCGM_TIMEOUT} dcgmi diag -r {int(arg.level)} -j 2>&1\n"
        'echo "@@rc $?"'
    )


def _status(text) -> str:
    t = str(text or "").strip().lower()
    return {
        "passed": "pass",
        "failed": "fail",
        "warning": "warn",
        "skipped": "skip",
        "not run": "skip",
        "notrun": "skip",
    }.get(t, t)


def _gpu_of(res: dict):
    for k in ("gpu_id", "gpu_ids", "entity_id"):
        if k in res:
            return res[k]
    ent = res.get("entity")
    return ent.get("entity_id") if isinstance(ent, dict) else None


def _texts(res: dict) -> list[str]:
    out = []
    for k in ("warnings", "errors", "warning", "error"):
        v = res.get(k)
        for item in v if isinstance(v, list) else [v] if v else []:
            if isinstance(item, dict):
                t = (
                    item.get("warning")
                    or item.get("warnings")
                    or item.get("message")
                    or item.get("msg")
                    or item.get("error")
                )
                code = item.get("error_id", item.get("error_code"))
                out.append(f"{t} (DCGM error {code})" if t and code is not None else str(t or item))
            else:
                out.append(str(item))
    return out


def _severity(res: dict) -> int | None:
    """The worst error_severity of RES's warnings (dcgm_errors.h: 1 MONITOR, 2 ISOLATE,
    3 UNKNOWN, 4 TRIAGE, 5 CONFIG, 6 RESET), None when DCGM gave none."""
    got = [w.get("error_severity") for w in res.get("warnings") or [] if isinstance(w, dict)]
    got = [g for g in got if isinstance(g, int)]
    return max(got, key=lambda s: (s not in (1, 5), s)) if got else None


def _tests(doc, category=None) -> list[dict]:
    """Every (test, result) of DOC, wherever the shape put it."""
    out = []
    if isinstance(doc, list):
        for x in doc:
            out += _tests(x, category)
    elif isinstance(doc, dict):
        cat = doc.get("category", category)
        if isinstance(doc.get("name"), str) and isinstance(doc.get("results"), list):
            for res in doc["results"]:
                if isinstance(res, dict) and res.get("entity_group", "GPU") == "GPU":
                    out.append(
                        {
                            "name": doc["name"],
                            "category": cat,
                            "gpu": _gpu_of(res),
                            "status": _status(res.get("status")),
                            "messages": _texts(res),
                            "severity": _severity(res),
                        }
                    )
        else:
            for v in doc.values():
                out += _tests(v, cat)
    return out


def _find(doc, key: str):
    """The first value under KEY anywhere in DOC."""
    if isinstance(doc, dict):
        if doc.get(key):
            return doc[key]
        doc = list(doc.values())
    for x in doc if isinstance(doc, list) else []:
        got = _find(x, key)
        if got:
            return got
    return None


def parse_dcgm(text: str, rc: int) -> dict:
    """{"state": absent|hung|error|ok, "version", "tests": [{"name", "category", "gpu",
    "status": pass|fail|warn|skip|..., "messages"}], "error"}."""
    if "@@absent" in text:
        return {"state": "absent"}
    body, _, tail = text.rpartition("@@rc ")
    code = int(tail.split()[0]) if tail.split() and tail.split()[0].isdigit() else rc
    if code in _HUNG:
        return {"state": "hung"}
    doc = json_document(body)
    if doc is None:
        return {"state": "error", "error": " ".join(body.split())[-300:] or f"dcgmi exit {code}"}
    tests = _tests(doc)
    runtime = _find(doc, "runtime_error")
    version = _find(doc, "version")
    if runtime or not tests:
        return {"state": "error", "error": str(runtime or " ".join(body.split())[-300:])[:300]}
    return {"state": "ok", "version": version, "tests": tests}


DCGM_DIAG = Fact("dcgm_diag", _dcgm_script, parse_dcgm)  # DCGM_DIAG(DcgmIn(level))


@dataclass(frozen=True)
class DeepIn:
    """GPU_DEEP's argument: the venv whose torch runs the work, the burn's seconds, the
    all_reduce's message size, and EMULATE (N CPU devices, 0: the real GPUs)."""

    venv: str
    seconds: float = 10.0
    nbytes: int = 1 << 30
    emulate: int = 0

    def __str__(self) -> str:
        return f"{self.venv}:{self.seconds:g}:{self.nbytes}:{self.emulate}"


def deep_limit(arg: DeepIn) -> int:
    """Seconds the GPU program may take: the burn, the all_reduce's own limit (120 s past the
    burn), torch's import and the spawn of one process per GPU; past it, a hang (a finding)."""
    return int(arg.seconds) + 240


def _deep_script(arg: DeepIn) -> str:
    text = nodeside.GPUDEEP.read_text()
    py = f"{rpath(arg.venv)}/bin/python"
    return (
        f"[ -x {py} ] || {{ echo @@novenv; exit 0; }}\n"
        "d=$(mktemp -d) || exit 1\n"
        "trap 'rm -rf \"$d\"' EXIT\n"
        "trap 'exit 143' HUP INT TERM\n"
        f"printf '%s' {shlex.quote(text)} > \"$d/gpudeep.py\" &&\n"
        f'  timeout -k 10 {deep_limit(arg)} {py} -I "$d/gpudeep.py" '
        f"--seconds {float(arg.seconds):g} --bytes {int(arg.nbytes)} --emulate {int(arg.emulate)}"
    )


def parse_deep(text: str, rc: int) -> dict:
    """The program's JSON line; {"state": "novenv"} without the venv; {"state": "error"} when
    it printed none (it crashed, or was stopped)."""
    if "@@novenv" in text:
        return {"state": "novenv"}
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            try:
                return {"state": "ok", **json.loads(line)}
            except ValueError:
                break
    tail = " ".join(text.split())[-300:]
    return {"state": "error", "error": tail or f"exit {rc}", "hung": rc in _HUNG}


GPU_DEEP = Fact(
    "gpu_deep", _deep_script, parse_deep, wrap=with_modules
)  # GPU_DEEP(DeepIn(venv, ...))
