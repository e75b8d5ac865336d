"""The inventory's train_* variables (src/nodeprep/inventory/defaults.yml): a job's --restarts,
--retry-on, --min-nodes and --resume-args where the flags leave them out. A flag given wins;
otherwise the job takes the value its selected nodes share, and nodes that disagree are an
input error naming both values and where each was set."""

from __future__ import annotations

import dataclasses

from nodeprep.commands.options import TrainOptions
from nodeprep.errors import InputError
from nodeprep.ops.train import causes

# TrainOptions field -> (its inventory variable, the value that means "the flag was not given")
FIELDS = {
    "restarts": ("train_restarts", None),
    "retry_on": ("train_retry_on", ()),
    "min_nodes": ("train_min_nodes", None),
    "resume_args": ("train_resume_args", ()),
}


def apply(opts: TrainOptions, inv, hosts: list) -> TrainOptions:
    """OPTS with each setting its flags left out taken from HOSTS' shared train_* value."""
    given = {}
    for name, (var, unset) in FIELDS.items():
        if getattr(opts, name) != unset:
            continue
        value = shared(inv, hosts, var)
        if name in ("retry_on", "resume_args"):
            value = tuple(_words(inv, hosts, var, value))
        given[name] = value
    out = dataclasses.replace(opts, **given)
    if out.restarts is None:
        out = dataclasses.replace(out, restarts=0)
    _check_classes(inv, hosts, out.retry_on if "retry_on" in given else ())
    return out


def shared(inv, hosts: list, var: str):
    """The value of VAR every host of HOSTS has; InputError naming two that differ."""
    first = hosts[0]
    value = inv.var(first, var)
    for h in hosts[1:]:
        other = inv.var(h, var)
        if other != value:
            raise InputError(
                f"{var}: {first.name} has {_shown(value)} ({_where(inv, first, var)}), "
                f"{h.name} has {_shown(other)} ({_where(inv, h, var)}): one job takes one value",
                f"set {var} once for every node of the job (or give its flag to train)",
            )
    return value


def _shown(value) -> str:
    return "null" if value is None else repr(value)


def _where(inv, host, var: str) -> str:
    return host.origin.get(var) or f"the default, {inv.schema[var].source}"


def _words(inv, hosts: list, var: str, value) -> list[str]:
    """VALUE, a list of strings; InputError at where it was set for anything else in it."""
    bad = [v for v in value if not isinstance(v, str) or not v]
    if bad:
        raise InputError(
            f"{var}: {bad[0]!r} is not a word: each item is one argument or class, as text",
            "quote it, e.g. ['--resume']",
            *_at(hosts[0], var),
        )
    return value


def _check_classes(inv, hosts: list, classes) -> None:
    bad = [c for c in classes if c not in causes.CLASSES or c in causes.NEVER]
    if bad:
        raise InputError(
            f"train_retry_on: {bad[0]!r} is not a failure class",
            "use " + ", ".join(c for c in causes.CLASSES if c not in causes.NEVER),
            *_at(hosts[0], "train_retry_on"),
        )


def _at(host, var: str) -> tuple:
    """(file, line) where HOST's VAR was set, (None, None) where it was not."""
    file, _, line = (host.origin.get(var) or "").rpartition(":")
    return file or None, int(line) if line.isdigit() else None
