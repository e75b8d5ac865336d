"""Tool settings (not node state): fan-out width, timeouts, where state and run logs go.

Values come from invoke.yaml's `nodeprep:` section, overridable with INVOKE_NODEPREP_*
environment variables (Invoke's own config hierarchy); tasks.py hands them over as a dict.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Settings:
    default_inventory: str = "local"
    width: int = 64                 # nodes worked on at once
    connect_timeout: float = 10.0   # seconds for the TCP + SSH handshake
    command_timeout: float = 900.0  # seconds for one remote command
    connect_retries: int = 3        # extra tries, for connection errors only
    retry_backoff: float = 0.5      # seconds, doubled after each failed try
    pin_new_host_keys: bool = True  # record a first-contact host key (never silently)
    state_dir: str = ".nodeprep"    # relative to the project root unless absolute
    lab_root: str = "/var/lib/nodeprep/labs"

    @classmethod
    def from_mapping(cls, data: dict | None) -> "Settings":
        data = dict(data or {})
        known = {f.name: f for f in fields(cls)}
        values = {}
        for key, value in data.items():
            if key in known:
                values[key] = type(getattr(cls, key))(value)
        return cls(**values)

    def with_(self, **kw) -> "Settings":
        return replace(self, **{k: v for k, v in kw.items() if v is not None})

    @property
    def state(self) -> Path:
        p = Path(self.state_dir)
        return p if p.is_absolute() else ROOT / p

    @property
    def known_hosts(self) -> Path:
        return self.state / "known_hosts"

    @property
    def runs(self) -> Path:
        return self.state / "runs"
