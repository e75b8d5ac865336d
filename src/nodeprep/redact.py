"""Secret-looking values never reach a log, a diff or a report.

A variable whose NAME contains KEY, TOKEN, SECRET or PASS (PASSWORD, ansible_ssh_pass; CREDENTIAL
too) is a secret; its VALUE is replaced wherever text is shown, at any depth: a key of a mapping
inside a variable (deepspeed_env: {WANDB_API_TOKEN: ...}) is a name too. Public-key material is not
a secret; names that hold a path (key, controller_key, ...) are the caller's to exempt."""

from __future__ import annotations

import re

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASS|CREDENTIAL", re.I)
MASK = "<redacted>"


def is_secret(name: str) -> bool:
    return bool(SECRET_NAME.search(name))


def masked(name: str, value, keep: tuple[str, ...] = ()):
    """VALUE as it may be shown: the whole of it masked under a secret NAME (not one in KEEP),
    else the same structure with every secret inside masked."""
    if is_secret(str(name)) and name not in keep:
        return MASK
    if isinstance(value, dict):
        return {k: masked(str(k), v, keep) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [masked("", v, keep) for v in value]
    return value


def secret_values(name: str, value, keep: tuple[str, ...] = ()) -> list[str]:
    """Every value held under a secret name at any depth of VALUE (itself named NAME)."""
    if is_secret(str(name)) and name not in keep:
        return _leaves(value)
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in secret_values(str(k), v, keep)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in secret_values("", v, keep)]
    return []


def _leaves(value) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _leaves(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _leaves(v)]
    return [] if value is None else [str(value)]


class Redactor:
    def __init__(self, values=()):
        # A multi-line secret (a private key) shows up line by line in a diff: mask each line.
        parts = {
            line.strip() for v in values for line in str(v).splitlines() if len(line.strip()) >= 8
        }
        self.values = sorted(
            {v for v in values if v and len(v) >= 3} | parts, key=len, reverse=True
        )

    @classmethod
    def from_env(cls, *mappings: dict) -> "Redactor":
        return cls(
            [s for m in mappings for k, v in (m or {}).items() for s in secret_values(str(k), v)]
        )

    def __call__(self, text: str) -> str:
        for v in self.values:
            text = text.replace(v, MASK)
        return text
