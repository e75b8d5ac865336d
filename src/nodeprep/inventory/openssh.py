"""OpenSSH's own reading of a host: `ssh -G [-F FILE] NAME`, the values the user's own
`ssh NAME` connects with, after Include, Match, tokens and canonicalization. `ssh -G` only
reads configuration: nothing is contacted. It runs for many names at once (a thread pool; one
run is a process of a few ms) and each answer is kept for the run (same name, same files).

A config ssh rejects (an option it does not know, such as macOS's `UseKeychain`; bad
permissions) is one InputError naming the file and line ssh names, with the fix ssh users
know. IdentityFile values come back as ssh prints them (tokens unexpanded): `identity_path`
expands the tokens ssh would."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import socket
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from nodeprep.errors import InputError

WIDTH = 16  # ssh -G processes at once
TIMEOUT = 20  # seconds for one: a `Match exec` that hangs must not hang nodeprep
_LINE_ERROR = re.compile(r"^(?P<file>.+?):? line (?P<line>\d+): (?P<why>.+)$")
_cache: dict[tuple, "Resolved"] = {}
_cache_lock = threading.Lock()


@dataclass(frozen=True)
class Resolved:
    """One name as `ssh -G` answers it: every option (lowercase key -> its values in order)."""

    name: str
    options: dict[str, list[str]] = field(default_factory=dict)

    def one(self, key: str) -> str | None:
        values = self.options.get(key)
        return values[0] if values else None

    @property
    def hostname(self) -> str:
        return self.one("hostname") or self.name

    @property
    def port(self) -> int:
        return int(self.one("port") or 22)

    @property
    def user(self) -> str | None:
        return self.one("user")

    @property
    def identity_files(self) -> list[str]:
        return list(self.options.get("identityfile", []))

    @property
    def proxyjump(self) -> str | None:
        value = self.one("proxyjump")
        return None if value in (None, "none") else value

    @property
    def proxycommand(self) -> str | None:
        value = self.one("proxycommand")
        return None if value in (None, "none") else value


def parse(name: str, text: str) -> Resolved:
    """`ssh -G` output: one `key value` line per option value."""
    options: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key:
            options.setdefault(key.lower(), []).append(value)
    return Resolved(name, options)


def _command(name: str, config: Path | None) -> list[str]:
    return ["ssh", "-G"] + (["-F", str(config)] if config else []) + ["--", name]


def _signature(files: list[Path]) -> tuple:
    out = []
    for f in files:
        try:
            st = f.stat()
            out.append((str(f), st.st_mtime_ns, st.st_size))
        except OSError:
            out.append((str(f), None, None))
    return tuple(out)


def resolve(
    names: list[str], config: Path | None = None, files: list[Path] = ()
) -> dict[str, Resolved]:
    """{name: Resolved} for every NAME, as `ssh -G` answers (CONFIG: `-F CONFIG`; None: the
    user's own ~/.ssh/config and the system config, as plain `ssh` reads them). FILES: the
    config files the answers depend on (kept answers are reused while they are unchanged).
    InputError when ssh rejects the config."""
    sig = (str(config), _signature(list(files)))
    with _cache_lock:
        out = {n: _cache[(sig, n)] for n in names if (sig, n) in _cache}
    todo = [n for n in dict.fromkeys(names) if n not in out]
    if todo:
        with ThreadPoolExecutor(max_workers=min(WIDTH, len(todo))) as pool:
            for name, got in zip(todo, pool.map(lambda n: _one(n, config), todo)):
                out[name] = got
        with _cache_lock:
            _cache.update({(sig, n): out[n] for n in todo})
    return out


def _one(name: str, config: Path | None) -> Resolved:
    try:
        r = subprocess.run(
            _command(name, config),
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            stdin=subprocess.DEVNULL,
            errors="replace",
        )
    except FileNotFoundError:
        raise InputError(
            "OpenSSH's `ssh` is not installed here: nodeprep reads ~/.ssh/config through `ssh -G`",
            "install openssh-client",
        ) from None
    except subprocess.TimeoutExpired:
        raise InputError(
            f"`ssh -G {name}` did not answer within {TIMEOUT} s (a `Match exec` "
            "command in the ssh config that hangs?)",
            "fix that Match exec",
        ) from None
    if r.returncode != 0 or not r.stdout.strip():
        raise rejected(name, r.stderr, config)
    return parse(name, r.stdout)


def rejected(name: str, stderr: str, config: Path | None = None) -> InputError:
    """ssh's complaint as one InputError: the first `FILE: line N: WHY` it names, with the fix;
    else naming CONFIG (or ~/.ssh/config)."""
    lines = [
        ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith("Pseudo-terminal")
    ]
    for ln in lines:
        m = _LINE_ERROR.match(ln)
        if m:
            why = m.group("why")
            return InputError(
                f"ssh rejects the config: {why}",
                _fix(why, m.group("file"), int(m.group("line"))),
                m.group("file"),
                int(m.group("line")),
            )
    first = lines[0] if lines else "no output"
    hint = (
        "make it yours and not writable by others: chmod 600 FILE"
        if "permissions" in first
        else f"run `ssh -G {shlex.quote(name)}` to see what ssh says"
    )
    return InputError(
        f"ssh rejects the config for {name!r}: {first}",
        hint,
        str(config) if config else "~/.ssh/config",
    )


def _fix(why: str, file: str, line: int) -> str:
    m = re.match(r"Bad configuration option: (\S+)", why)
    if m:
        option = _spelled(file, line, m.group(1))
        return (
            f"this ssh does not know {option} (an option of another platform's ssh, e.g. "
            f"macOS): put `IgnoreUnknown {option}` above that line, or remove it"
        )
    if "Unsupported option" in why:
        return "remove the option: this OpenSSH no longer supports it"
    return "fix that line (see `man ssh_config`); ssh itself refuses it"


def _spelled(file: str, line: int, option: str) -> str:
    """The option as the file spells it (ssh prints it lowercased)."""
    try:
        text = Path(file).read_text(errors="replace").splitlines()[line - 1]
    except (OSError, IndexError):
        return option
    word = re.split(r"[\s=]", text.strip(), maxsplit=1)[0]
    return word if word.lower() == option.lower() else option


def identity_path(value: str, resolved: Resolved, local_user: str, home: Path) -> str:
    """An IdentityFile value as ssh opens it: ~, ${VAR} and the %-tokens ssh expands there
    (%% %d %h %i %L %l %n %p %r %u %C). A token it cannot know stays as written."""
    if value.startswith("~/") or value == "~":
        value = str(home) + value[1:]
    value = re.sub(
        r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: os.environ.get(m.group(1), m.group(0)), value
    )
    long_host = socket.gethostname()
    tokens = {
        "d": str(home),
        "h": resolved.hostname,
        "i": str(os.getuid()),
        "L": long_host.split(".")[0],
        "l": long_host,
        "n": resolved.name,
        "p": str(resolved.port),
        "r": resolved.user or local_user,
        "u": local_user,
    }
    tokens["C"] = hashlib.sha1(
        (tokens["l"] + tokens["h"] + tokens["p"] + tokens["r"]).encode()
    ).hexdigest()
    return re.sub(
        r"%(.)", lambda m: "%" if m.group(1) == "%" else tokens.get(m.group(1), m.group(0)), value
    )


def default_identities() -> list[str]:
    """The identity files ssh tries when a config names none (`ssh -G -F /dev/null`)."""
    return resolve(["nodeprep-no-such-host.invalid"], Path("/dev/null"))[
        "nodeprep-no-such-host.invalid"
    ].identity_files
