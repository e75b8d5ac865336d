"""Secret-looking values never reach a log, a diff or a report.

A variable whose NAME contains KEY, TOKEN, SECRET or PASS (PASSWORD, ansible_ssh_pass; CREDENTIAL too) is a
secret; its VALUE is replaced wherever text is shown. Public-key material is not a secret."""
from __future__ import annotations

import re

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASS|CREDENTIAL", re.I)
MASK = "<redacted>"


def is_secret(name: str) -> bool:
    return bool(SECRET_NAME.search(name))


class Redactor:
    def __init__(self, values=()):
        # A multi-line secret (a private key) shows up line by line in a diff: mask each line.
        parts = {line.strip() for v in values for line in str(v).splitlines() if len(line.strip()) >= 8}
        self.values = sorted({v for v in values if v and len(v) >= 3} | parts, key=len, reverse=True)

    @classmethod
    def from_env(cls, *mappings: dict) -> "Redactor":
        return cls([str(v) for m in mappings for k, v in (m or {}).items() if is_secret(k)])

    def __call__(self, text: str) -> str:
        for v in self.values:
            text = text.replace(v, MASK)
        return text
