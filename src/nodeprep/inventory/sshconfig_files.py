"""An OpenSSH client config read the way ssh(1) reads it, for what it names: the literal
`Host` names of the config and of every file it includes, each with its file:line, and every
file read (what `ssh -G` answers depend on). The VALUES of an alias are OpenSSH's own
business (`ssh -G`, sshconfig.py); this module decides nothing about them.

The rules, from OpenSSH 9.2's readconf.c and misc.c (argv_split, strdelim):
- a line is a keyword and its arguments; the keyword ends at whitespace or at one `=`
  (`HostName=x`, `HostName = x`); a line whose keyword starts with `#` is a comment;
- arguments split at spaces and tabs; "double" or 'single' quotes group, a backslash escapes a
  quote, a backslash or (outside quotes) a space; an argument that STARTS with `#` ends the
  line (`Host pi   # my Pi`: one name, pi); an unclosed quote is an error;
- `Include` takes one or more paths: a relative path is `~/.ssh/PATH` (a user config;
  /etc/ssh/PATH for the system one), then glob(3) with GLOB_TILDE expands it in sorted order
  (glibc: `~` is $HOME when set, `~user` that user's home), no match is no error, and includes
  nest up to 16 deep. An Include inside a `Host` or `Match` block is read too (ssh reads it
  only for the hosts that block matches; the names it defines are still the config's names);
- `Host` arguments are patterns: a name with `*` or `?`, or starting with `!`, is no alias.
The user's own config is found through the PASSWD home, as ssh finds it (not $HOME); the
includes inside it through $HOME, as ssh's glob finds them (OpenSSH 9.2 on glibc, measured)."""

from __future__ import annotations

import glob
import os
import pwd
from dataclasses import dataclass, field
from pathlib import Path

from nodeprep.errors import InputError
from nodeprep.inventory.ini import read_text
from nodeprep.inventory.yamlfile import shown_path

MAX_DEPTH = 16  # READCONF_MAX_DEPTH
_SPACE = " \t"


def passwd_home() -> Path:
    """The home OpenSSH uses for ~/.ssh: the passwd entry's, not $HOME."""
    try:
        return Path(pwd.getpwuid(os.getuid()).pw_dir)
    except KeyError:  # no passwd entry (a container's odd uid): what ssh cannot do either
        return Path.home()


def split_keyword(line: str) -> tuple[str, str] | None:
    """(keyword lowercased, the rest) of a config line, or None for a blank or comment line.
    The keyword ends at whitespace or one '=' (OpenSSH's strdelim)."""
    text = line.rstrip(" \t\r\n\f").lstrip(_SPACE)
    if not text or text.startswith("#"):
        return None
    end = next((i for i, c in enumerate(text) if c in _SPACE + "="), len(text))
    keyword = text[:end]
    delim = text[end : end + 1]
    rest = text[end + 1 :].lstrip(_SPACE)
    if delim != "=" and rest.startswith("="):  # `Keyword = value`
        rest = rest[1:].lstrip(_SPACE)
    return keyword.lower(), rest


def arguments(rest: str) -> list[str]:
    """OpenSSH's argv_split with comments: ValueError for an unclosed quote."""
    out: list[str] = []
    i, n = 0, len(rest)
    while i < n:
        if rest[i] in _SPACE:
            i += 1
            continue
        if rest[i] == "#":
            break
        quote, word = "", []
        while i < n:
            c = rest[i]
            if (
                c == "\\"
                and i + 1 < n
                and (rest[i + 1] in "'\"\\" or (not quote and rest[i + 1] == " "))
            ):
                word.append(rest[i + 1])
                i += 2
                continue
            if not quote and c in _SPACE:
                break
            if not quote and c in "\"'":
                quote = c
            elif quote and c == quote:
                quote = ""
            else:
                word.append(c)
            i += 1
        if quote:
            raise ValueError("invalid quotes")
        out.append("".join(word))
    return out


def is_alias(name: str) -> bool:
    """A concrete name: no wildcard, no negation (and not empty)."""
    return bool(name) and not any(c in name for c in "*?") and not name.startswith("!")


@dataclass(frozen=True)
class Alias:
    name: str
    file: str  # as messages show it
    line: int

    @property
    def origin(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass
class ConfigFiles:
    """What reading a config (and its includes) found."""

    files: list[Path] = field(default_factory=list)  # every file read, in order
    aliases: list[Alias] = field(default_factory=list)  # first definition of each name
    options: set[str] = field(default_factory=set)  # every keyword used (lowercased)
    match_lines: list[tuple[str, int, list[str]]] = field(
        default_factory=list
    )  # (file, line, criteria)

    def alias(self, name: str) -> Alias | None:
        return next((a for a in self.aliases if a.name == name), None)


def read(path: Path, home: Path | None = None, system: bool = False) -> ConfigFiles:
    """PATH as ssh reads a user config (SYSTEM: the system one, includes under /etc/ssh);
    InputError with file:line for what ssh refuses to parse (quotes, include depth)."""
    out = ConfigFiles()
    _read(Path(path), home or passwd_home(), system, out, 0)
    return out


def _read(path: Path, home: Path, system: bool, out: ConfigFiles, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise InputError(
            "too many nested Include levels (OpenSSH stops at 16)",
            "an Include probably includes itself",
            shown_path(path),
        )
    if depth and not os.access(path, os.R_OK):
        return  # ssh skips an include it cannot open, too
    lines = read_text(path)  # UTF-8, no control characters: file:line errors
    out.files.append(path)
    file = shown_path(path)
    known = {a.name for a in out.aliases}
    for number, line in enumerate(lines, 1):
        kw = split_keyword(line)
        if kw is None:
            continue
        keyword, rest = kw
        try:
            args = arguments(rest)
        except ValueError:
            raise InputError(
                "invalid quotes (an unclosed \" or ')",
                "close the quote, as ssh requires",
                file,
                number,
            ) from None
        out.options.add(keyword)
        if keyword == "host":
            for name in args:
                if is_alias(name) and name not in known:
                    out.aliases.append(Alias(name, file, number))
                    known.add(name)
        elif keyword == "match":
            out.match_lines.append((file, number, args))
        elif keyword == "include":
            for inc in _include_paths(args, home, system):
                _read(inc, home, system, out, depth + 1)
            known = {a.name for a in out.aliases}


def glob_home(home: Path) -> Path:
    """The home glob(3)'s GLOB_TILDE gives `~`: $HOME when set (glibc), else HOME."""
    return Path(os.environ["HOME"]) if os.environ.get("HOME") else home


def _include_paths(args: list[str], home: Path, system: bool) -> list[Path]:
    """The files one Include line names, in ssh's order (each argument's glob, sorted)."""
    out = []
    for arg in args:
        if not arg.startswith(("/", "~")):
            arg = f"/etc/ssh/{arg}" if system else f"~/.ssh/{arg}"
        if arg.startswith("~"):
            user, _, rest = arg[1:].partition("/")
            try:
                base = glob_home(home) if not user else Path(pwd.getpwnam(user).pw_dir)
            except KeyError:
                continue  # glob leaves `~nosuchuser` as it is: it matches no file
            arg = str(base / rest) if rest else str(base)
        out += [Path(p) for p in sorted(glob.glob(arg)) if Path(p).is_file()]
    return out
