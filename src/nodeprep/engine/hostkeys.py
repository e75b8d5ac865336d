"""The project-managed known_hosts: pin on first contact, refuse a changed key.

Fabric's Connection installs paramiko's AutoAddPolicy and loads no known_hosts at all, so
every Connection the engine opens gets this store's keys and `PinningPolicy` instead.
A first contact is recorded in the file (never silently accepted in memory only); a key
that differs from the recorded one makes paramiko raise BadHostKeyException, which the
session turns into a per-node failure naming both fingerprints and the fix.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import io
import os
import threading
from contextlib import contextmanager
from pathlib import Path

import paramiko
from paramiko.hostkeys import HostKeyEntry, InvalidHostKey

from nodeprep.errors import InputError, NodeprepError
from nodeprep.inventory.yamlfile import read_input

_lock = threading.Lock()
_cache_lock = threading.Lock()
_cache: dict[
    str, tuple
] = {}  # path -> (stat stamp, HostKeys, {name: {type: key}}, has hashed/wildcard)
_parsing: dict[str, threading.Lock] = {}  # path -> held while one thread parses it


def key_fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def host_entry(address: str, port: int) -> str:
    """The name OpenSSH and paramiko use for a host in known_hosts."""
    return address if int(port) == 22 else f"[{address}]:{port}"


class HostKeyChanged(NodeprepError):
    pass


class UnknownHostKey(NodeprepError):
    pass


class PinnedHostKeys:
    """A known_hosts file shared by threads and processes (flock + a process lock)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    @contextmanager
    def _locked(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with _lock, open(str(self.path) + ".lock", "a") as lockf:
            fcntl.flock(lockf, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lockf, fcntl.LOCK_UN)

    def load(self) -> paramiko.HostKeys:
        """The pinned keys (read-only: shared by every caller until the file changes); parsed
        once per change of the file, not per lookup: a run looks up every node from every
        thread, and paramiko parses each line under the logging module's global lock."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return paramiko.HostKeys()
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        keys = self._cached(stamp)
        if keys is not None:
            return keys
        with _cache_lock:
            parsing = _parsing.setdefault(str(self.path), threading.Lock())
        # One thread parses, the others wait for its answer: every session of a run asks at
        # once when the run starts (64 nodes parsed the file 64 times over, each parse ~1 ms
        # per 10 lines at 128 lines, all under the logging module's lock).
        with parsing:
            keys = self._cached(stamp)
            return keys if keys is not None else self._index(stamp)

    def _cached(self, stamp) -> paramiko.HostKeys | None:
        with _cache_lock:
            hit = _cache.get(str(self.path))
        return hit[1] if hit and hit[0] == stamp else None

    def _index(self, stamp) -> paramiko.HostKeys:
        keys = self._parse()
        index: dict[str, dict[str, paramiko.PKey]] = {}
        other = False  # hashed or wildcard entries: only paramiko's lookup matches them
        for entry in keys._entries:
            for name in entry.hostnames:
                if name.startswith("|") or any(c in name for c in "*?!"):
                    other = True
                else:
                    index.setdefault(name, {})[entry.key.get_name()] = entry.key
        with _cache_lock:
            _cache[str(self.path)] = (stamp, keys, index, other)
        return keys

    def _parse(self) -> paramiko.HostKeys:
        """The file's entries, each line parsed once: paramiko's HostKeys.load checks every
        line against every earlier entry (quadratic: 16 million name matches for 4,000
        lines). A name pinned twice to the same key is kept once, as load() does. InputError
        naming the file and line for a file that is not UTF-8 text or a key that is not
        base64 (a hand edit gone wrong)."""
        keys = paramiko.HostKeys()
        text = read_input(self.path, str(self.path))
        seen: set = set()
        for number, line in enumerate(io.StringIO(text, newline=None), 1):  # as open() reads
            line = line.strip()
            if not line or line[0] == "#":
                continue
            try:
                entry = HostKeyEntry.from_line(line, number)
            except (InvalidHostKey, ValueError) as exc:  # ValueError: base64 that is no key
                raise InputError(
                    f"not a known_hosts line: {getattr(exc, 'exc', exc)}",
                    "fix the line, or delete it to pin the node's key again on the next contact",
                    str(self.path),
                    number,
                ) from None
            except paramiko.SSHException:
                continue  # as load(): a line paramiko cannot use is skipped
            if entry is None:
                continue
            key = (entry.key.get_name(), entry.key.asbytes())
            names = [h for h in dict.fromkeys(entry.hostnames) if (h, key) not in seen]
            seen.update((h, key) for h in names)
            if names:
                entry.hostnames = names
                keys._entries.append(entry)
        return keys

    def lookup(self, address: str, port: int = 22) -> dict[str, paramiko.PKey]:
        """{key type: key} pinned for ADDRESS:PORT; a dict lookup, not a scan of the file."""
        keys, name = self.load(), host_entry(address, port)
        with _cache_lock:
            hit = _cache.get(str(self.path))
        if hit and hit[1] is keys and not hit[3]:
            return dict(hit[2].get(name, {}))
        found = keys.lookup(name)
        return dict(found) if found else {}

    def record(self, name: str, key: paramiko.PKey) -> bool:
        """Append NAME's key unless already there; True when a line was added."""
        with self._locked():
            keys = self.load()
            current = keys.lookup(name)  # NAME is already a host_entry
            if current and current.get(key.get_name()) == key:
                return False
            if current and key.get_name() in current:
                raise HostKeyChanged(
                    f"{name}: a different {key.get_name()} key is already pinned; refusing to add"
                )
            with open(self.path, "a") as fh:
                fh.write(f"{name} {key.get_name()} {key.get_base64()}\n")
            os.chmod(self.path, 0o600)
            return True

    def pin(self, name: str, key: paramiko.PKey) -> bool:
        """Make KEY the only pinned key for NAME (for hosts whose key we made ourselves).

        True when the file changed."""
        with self._locked():
            lines = read_input(self.path, str(self.path)).splitlines() if self.path.exists() else []
            wanted = f"{name} {key.get_name()} {key.get_base64()}"
            kept = [ln for ln in lines if not _names_match(ln, name)]
            if wanted in lines and len(kept) == len(lines) - 1:
                return False
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text("\n".join(kept + [wanted]) + "\n")
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.path)
            return True

    def forget(self, name: str) -> int:
        """Drop every line for NAME; returns how many were removed."""
        with self._locked():
            if not self.path.exists():
                return 0
            lines = read_input(self.path, str(self.path)).splitlines()
            kept = [ln for ln in lines if not _names_match(ln, name)]
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text("".join(ln + "\n" for ln in kept))
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.path)
            return len(lines) - len(kept)


def _names_match(line: str, name: str) -> bool:
    fields = line.split()
    return bool(fields) and name in fields[0].split(",")


class PinningPolicy(paramiko.MissingHostKeyPolicy):
    """First contact: record the key in the project known_hosts (trust on first use, written
    down), or refuse when `allow_new` is off. Changed keys never reach this policy: paramiko
    raises BadHostKeyException for them before asking it."""

    def __init__(self, store: PinnedHostKeys, allow_new: bool = True, on_pin=None):
        self.store = store
        self.allow_new = allow_new
        self.on_pin = on_pin

    def missing_host_key(self, client, hostname, key):
        if not self.allow_new:
            raise UnknownHostKey(
                f"{hostname}: host key {key_fingerprint(key)} is not pinned in "
                f"{self.store.path} and "
                "first-contact pinning is off",
                hint="check the fingerprint on the node, then run with pinning allowed "
                "(nodeprep.pin_new_host_keys: true) or add it to the known_hosts file",
            )
        self.store.record(hostname, key)
        if self.on_pin:
            self.on_pin(hostname, key)


def attach(
    client: paramiko.SSHClient,
    store: PinnedHostKeys,
    target: tuple[str, int],
    allow_new: bool = True,
    on_pin=None,
) -> None:
    """Give a paramiko client (e.g. a Fabric Connection's) the keys pinned for the one
    TARGET (address, port) it connects to, and our policy. Only that host's keys: copying the
    whole file into every client cost O(N) per connection (paramiko's add() scans its list)."""
    keys = client.get_host_keys()
    keys.clear()
    name = host_entry(*target)
    for ktype, key in store.lookup(*target).items():
        keys.add(name, ktype, key)
    client.set_missing_host_key_policy(PinningPolicy(store, allow_new, on_pin))
