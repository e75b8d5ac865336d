"""Fleet parity: group equal fact values under one folded node set, the way clubak does.

compare() keeps the keys on which reachable nodes disagree (cli/parity_text.py shows each as a key
line then `  worker-[0-1]  1.26.4` / `  worker-2      2.0.1`, and one verdict line). A key missing
on a node is the value None, shown as "-". Severity comes from the longest matching key prefix
(default "error"); warning and info drift never fail.

Baselines: fingerprint_file_write() stores a fleet's fingerprints; against_baseline() reports
each key that changed since then as one Drift per (key, old value, new value) transition.
Its two groups hold the same nodes and carry a label, "baseline" for the old value and
"now" for the current one, so the JSON reads {"nodes": [...], "value": ..., "label": ...}.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path

from nodeprep.errors import InputError
from nodeprep.inventory.yamlfile import read_input

SEVERITIES = ("error", "warning", "info")
# Kernels and OS point releases drift with unattended upgrades; worth seeing, not failing.
DEFAULT_SEVERITY = {"kernel": "warning", "os.release": "warning"}
FORMAT, VERSION = "nodeprep-fingerprint", 1


@dataclass
class Group:
    nodes: list[str]
    value: object
    label: str | None = None  # only against_baseline() sets it: "baseline" or "now"

    def as_dict(self) -> dict:
        d = {"nodes": list(self.nodes), "value": self.value}
        return d if self.label is None else {**d, "label": self.label}


@dataclass
class Drift:
    key: str
    severity: str
    groups: list[Group]

    def odd_nodes(self) -> list[str]:
        """Nodes that stray from the majority; all of them when there is no clear majority
        (a tie) or when the groups are before/after pairs from a baseline."""
        nodes = [n for g in self.groups for n in g.nodes]
        if any(g.label for g in self.groups):
            return list(dict.fromkeys(nodes))
        if len(self.groups) > 1 and len(self.groups[0].nodes) > len(self.groups[1].nodes):
            return [n for g in self.groups[1:] for n in g.nodes]
        return nodes


@dataclass
class Report:
    nodes: list[str]
    drift: list[Drift]
    unreachable: dict[str, str]
    _: KW_ONLY
    checks: list[dict]
    compared_keys: int
    compared_nodes: int = 0  # nodes whose values were compared (none compared proves nothing)
    baseline: bool = False  # words the verdict as "changed since the baseline"
    vetoes: list[str] = field(default_factory=list)  # other parts of the run that failed
    # (verify --collective's all_reduce)
    per_platform: list[Drift] = field(default_factory=list)  # differences that follow the CPU
    # platform in a mixed fleet (expected)

    @property
    def ok(self) -> bool:
        """The one verdict: nodes were compared, none is unreachable, no drift or check of
        severity error, nothing vetoed it. Warning and info never fail."""
        return (
            self.compared_nodes > 0
            and not self.unreachable
            and not self.vetoes
            and all(d.severity != "error" for d in self.drift)
            and all(c["severity"] != "error" for c in self.checks)
        )

    def as_dict(self) -> dict:
        return {
            "ok": self.ok,
            "drift": [
                {"key": d.key, "severity": d.severity, "groups": [g.as_dict() for g in d.groups]}
                for d in self.drift
            ],
            "unreachable": dict(self.unreachable),
            "checks": [dict(c) for c in self.checks],
            "nodes": list(self.nodes),
            "compared_keys": self.compared_keys,
            "per_platform": [
                {"key": d.key, "groups": [g.as_dict() for g in d.groups]} for d in self.per_platform
            ],
        }


# What follows the CPU platform by design: the architecture; the packages each platform's own
# lock pins (its wheelhouse is resolved for its markers, its torch build chosen for it); the
# torch build's own keys. Any other key is expected per platform only when its values differ
# by nothing but the architecture's name (library paths: /usr/lib/x86_64-linux-gnu/...).
PLATFORM_KEYS = ("cpu.arch", "pkg.", "torch.version", "torch.cuda", "torch.nccl")
ARCH_NAMES = ("x86_64", "aarch64", "amd64", "arm64", "ppc64le", "x86-64")


def split_by_platform(report: Report, platform_of: dict) -> None:
    """In a fleet of several CPU platforms (PLATFORM_OF: node -> arch), move each drift whose
    groups follow the platforms (every platform's nodes share one value; different platforms
    may differ) and whose key follows the platform (PLATFORM_KEYS, or values equal once the
    architecture's name is taken out) from report.drift to report.per_platform. Drift within
    a platform, or on any other key, stays drift."""
    if len(set(platform_of.values())) < 2:
        return
    keep = []
    for d in report.drift:
        aligned = all(len({platform_of.get(n) for n in g.nodes}) == 1 for g in d.groups) and len(
            {platform_of.get(g.nodes[0]) for g in d.groups}
        ) == len(d.groups)
        if aligned and _follows_platform(d):
            report.per_platform.append(Drift(d.key, "info", d.groups))
        else:
            keep.append(d)
    report.drift = keep


def _follows_platform(d: Drift) -> bool:
    bare = lambda prefix: prefix.rstrip(".")
    if any(d.key == bare(p) or (p.endswith(".") and d.key.startswith(p)) for p in PLATFORM_KEYS):
        return True
    texts = set()
    for g in d.groups:
        text = canon(g.value)
        for name in ARCH_NAMES:
            text = text.replace(name, "ARCH")
        texts.add(text)
    return len(texts) == 1


def severity_of(key: str, severity: dict | None = None) -> str:
    """The severity of the longest prefix of KEY in the map; prefixes match whole dotted
    parts, so "kernel" covers "kernel.release" but not "kernelspace"."""
    table = {**DEFAULT_SEVERITY, **(severity or {})}
    best, level = -1, "error"
    for prefix, value in table.items():
        if value not in SEVERITIES:
            raise ValueError(
                f"severity for '{prefix}' is '{value}', use one of {', '.join(SEVERITIES)}"
            )
        bare = prefix.rstrip(".")
        hit = bare == "" or key == bare or key.startswith(bare + ".")
        if hit and len(bare) > best:
            best, level = len(bare), value
    return level


def canon(value) -> str:
    # Values are grouped by their JSON text: 1 and "1" and True stay apart, lists work too.
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=repr)


def _ordered(order, *sources) -> list[str]:
    return list(dict.fromkeys([*(order or ()), *(n for source in sources for n in source)]))


def _rank(drift: Drift):
    return SEVERITIES.index(drift.severity), drift.key


def compare(
    fingerprints: dict,
    severity: dict | None = None,
    checks=(),
    unreachable: dict | None = None,
    order=None,
) -> Report:
    """Group every key's values across reachable nodes; keep the keys that differ.

    ORDER is the inventory order (nodes not in it follow in the order given). A node in
    ORDER with neither a fingerprint nor an unreachable reason is counted unreachable, so
    a node that silently fell out of the run can never pass as identical."""
    unreachable = dict(unreachable or {})
    nodes = _ordered(order, fingerprints, unreachable)
    for node in nodes:
        if node not in fingerprints and node not in unreachable:
            unreachable[node] = "no fingerprint collected"
    unreachable = {n: unreachable[n] for n in nodes if n in unreachable}
    reachable = [n for n in nodes if n not in unreachable]
    keys = sorted({k for n in reachable for k in fingerprints[n]})
    drift = []
    for key in keys:
        buckets: dict[str, Group] = {}
        for node in reachable:
            value = fingerprints[node].get(key)
            buckets.setdefault(canon(value), Group([], value)).nodes.append(node)
        if len(buckets) > 1:
            groups = sorted(buckets.values(), key=lambda g: (-len(g.nodes), canon(g.value)))
            drift.append(Drift(key, severity_of(key, severity), groups))
    drift.sort(key=_rank)
    checks = [
        {
            "node": c.get("node", ""),
            "key": c.get("key", ""),
            "message": c.get("message", ""),
            "severity": c.get("severity") or severity_of(c.get("key", ""), severity),
        }
        for c in checks
    ]
    return Report(
        nodes,
        drift,
        unreachable,
        checks=checks,
        compared_keys=len(keys),
        compared_nodes=len(reachable),
    )


def against_baseline(
    current: dict,
    baseline: dict,
    severity: dict | None = None,
    unreachable: dict | None = None,
    order=None,
) -> Report:
    """What changed on each node since BASELINE (a fingerprints dict as baseline_read gives).

    Nodes making the same change share one Drift; a node only in the baseline or only now
    is a check with key "baseline" (an added node was never compared, so it is an error)."""
    nodes = _ordered(order, current, baseline, unreachable or {})
    unreachable = {n: (unreachable or {})[n] for n in nodes if n in (unreachable or {})}
    both = [n for n in nodes if n in current and n in baseline and n not in unreachable]
    keys = sorted({k for n in both for k in (*current[n], *baseline[n])})
    drift = []
    for key in keys:
        moves: dict[tuple[str, str], tuple[object, object, list[str]]] = {}
        for node in both:
            old, new = baseline[node].get(key), current[node].get(key)
            if canon(old) != canon(new):
                moves.setdefault((canon(old), canon(new)), (old, new, []))[2].append(node)
        ranked = sorted(moves.items(), key=lambda kv: (-len(kv[1][2]), kv[0]))
        for old, new, moved in (move for _, move in ranked):
            drift.append(
                Drift(
                    key,
                    severity_of(key, severity),
                    [Group(moved, old, "baseline"), Group(list(moved), new, "now")],
                )
            )
    drift.sort(key=_rank)
    # Both are errors: an added node was never compared, a removed one cannot be any more.
    checks = [
        {
            "node": n,
            "key": "baseline",
            "severity": "error",
            "message": "added since the baseline, nothing to compare it with"
            if n not in baseline
            else "in the baseline but no fingerprint now",
        }
        for n in nodes
        if n not in unreachable and (n in current) != (n in baseline)
    ]
    return Report(
        nodes,
        drift,
        unreachable,
        checks=checks,
        compared_keys=len(keys),
        compared_nodes=len(both),
        baseline=True,
    )


def fingerprint_file_write(path, fingerprints: dict, meta: dict | None = None) -> None:
    """Write fingerprints as JSON, atomically: a reader sees the old file or the new one.
    Keys are sorted inside each node (stable diffs); nodes keep inventory order."""
    path = Path(path)
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "meta": meta or {},
        "fingerprints": {n: dict(sorted(fp.items())) for n, fp in fingerprints.items()},
    }
    text = json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def baseline_read(path) -> tuple[dict, dict]:
    """(fingerprints, meta) from a file fingerprint_file_write made; InputError otherwise."""
    name = str(path)
    if not Path(path).exists():
        raise InputError("baseline file not found", "record a baseline first", file=name)
    text = read_input(path, name)  # unreadable, or not UTF-8 (its line): InputError
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(
            f"not valid JSON: {err.msg} (column {err.colno})",
            "record the baseline again",
            file=name,
            line=err.lineno,
        ) from None
    except (ValueError, RecursionError):  # a number of more than 4300 digits, deep nesting
        raise InputError(
            "not a fingerprint file: a number too long or values nested too deeply",
            "record the baseline again",
            file=name,
        ) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise InputError(f'not a nodeprep fingerprint file (no "format": "{FORMAT}")', file=name)
    if doc.get("version") != VERSION:
        raise InputError(
            f"fingerprint file version {doc.get('version')!r}, this nodeprep "
            f"reads version {VERSION}",
            "record the baseline again",
            file=name,
        )
    fps, meta = doc.get("fingerprints"), doc.get("meta", {})
    if not (
        isinstance(fps, dict)
        and isinstance(meta, dict)
        and all(isinstance(fp, dict) for fp in fps.values())
    ):
        raise InputError(
            '"fingerprints" must map node -> {key: value}, "meta" must be an object',
            "record the baseline again",
            file=name,
        )
    return fps, meta
