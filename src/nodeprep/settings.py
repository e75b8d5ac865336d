"""Tool settings (not node state): fan-out width, timeouts, where the project, state and run
logs are.

Values come from invoke.yaml's `nodeprep:` section, overridable with INVOKE_NODEPREP_*
environment variables (Invoke's own config hierarchy); tasks.py hands them over as a dict,
with the project root (the directory of tasks.py). Without one, the project is found the way
Invoke finds tasks.py: the nearest directory from the current one upwards that holds
tasks.py and roles/.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path


def find_project(start: Path | None = None) -> Path:
    """The nearest directory from START (default: the current one) upwards holding tasks.py
    and roles/; START itself when there is none."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / "tasks.py").is_file() and (d / "roles").is_dir():
            return d
    return here


@dataclass(frozen=True)
class Settings:
    default_inventory: str = "local"
    width: int = 64  # nodes worked on at once
    connect_timeout: float = 10.0  # seconds for the TCP + SSH handshake: a silent address is
    # named after this, never retried
    silent_after: float = 15.0  # a connected node that acknowledges nothing (data, TCP
    # keepalives) this long is unreachable: its steps stop there
    probe_timeout: float = 120.0  # seconds for one fact probe (nvidia-smi, `import torch`)
    command_timeout: float = 900.0  # seconds for any other remote command
    connect_retries: int = 3  # extra tries, only for a refused or reset connection
    retry_backoff: float = 0.5  # seconds, doubled after each failed try
    pin_new_host_keys: bool = True  # record a first-contact host key (never silently)
    lock_wait: float = 900.0  # seconds a run waits for another run's home/machine lock
    lock_stale: float = 7200.0  # a lock held longer than this is taken over
    state_dir: str = ".nodeprep"  # relative to the project root unless absolute
    lab_root: str = "/var/lib/nodeprep/labs"
    project_root: str = ""  # inventory/, roles/ (and a relative state_dir) live here

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
    def project(self) -> Path:
        return Path(self.project_root).resolve() if self.project_root else find_project()

    @property
    def roles_dir(self) -> Path:
        return self.project / "roles"

    @property
    def state(self) -> Path:
        p = Path(self.state_dir)
        return p if p.is_absolute() else self.project / p

    @property
    def known_hosts(self) -> Path:
        return self.state / "known_hosts"

    @property
    def runs(self) -> Path:
        return self.state / "runs"
