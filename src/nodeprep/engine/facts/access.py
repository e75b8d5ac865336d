"""What a node lets its user do, for `invoke doctor`: whether sudo works without a password
(for everything, or just the login shell change the shell role would run), and where the
user's interactive login shell finds the programs a launcher needs that the non-interactive
PATH (what pdsh and mpirun get) lacks."""

from __future__ import annotations

import shlex

from nodeprep.engine.facts.probe import Fact


def _sudo_script(arg: tuple[str, str]) -> str:
    """ARG: (the login shell wanted, the user). `sudo -n -l CMD ARGS` exits 0 exactly when
    sudoers allows that command line without a password."""
    want, user = (shlex.quote(a) for a in arg)
    return (
        'if [ "$(id -u)" -eq 0 ]; then echo root\n'
        "elif ! command -v sudo >/dev/null 2>&1; then echo missing\n"
        "elif sudo -n true >/dev/null 2>&1; then echo all\n"
        f"elif sudo -n -l /usr/sbin/usermod -s {want} {user} >/dev/null 2>&1; then echo usermod\n"
        "else echo none; fi"
    )


def _sudo(text: str, rc: int) -> str | None:
    """root | all (passwordless sudo) | usermod (only the login shell change) | none (sudo
    asks a password or refuses) | missing (no sudo program); None: no answer."""
    words = text.split()
    return (
        words[-1] if words and words[-1] in ("root", "all", "usermod", "none", "missing") else None
    )


SUDO = Fact("sudo", _sudo_script, _sudo)  # SUDO((login shell wanted, user))

LOGIN_TIMEOUT = (
    10  # seconds: a login shell's rc files that wait on a terminal must not hang the probe
)


def _login_finds_script(programs: tuple[str, ...]) -> str:
    """The login shell (interactive, as a user's terminal has it) says where each program is;
    bash's `command -v` also names a file that is not executable: only executables count.
    Not asked of a csh or fish login shell (the shell role refuses those anyway)."""
    loop = (
        "for p in "
        + " ".join(shlex.quote(p) for p in programs)
        + '; do q=$(command -v "$p") && [ -x "$q" ] && printf "%s\\n" "$q"; done'
    )
    return (
        'case "${SHELL##*/}" in\n'
        "  csh|tcsh|fish) ;;\n"
        f'  *) timeout {LOGIN_TIMEOUT} "${{SHELL:-/bin/sh}}" -lic {shlex.quote(loop)} '
        "</dev/null 2>/dev/null;;\n"
        "esac\n"
        "true"
    )


def _login_finds(text: str, rc: int) -> dict[str, str]:
    """{program: path} for each program the login shell found: lines that are absolute
    paths (an rc file's own chatter is skipped), keyed by their last component."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("/") and not line.endswith("/"):
            out.setdefault(line.rsplit("/", 1)[-1], line)
    return out


LOGIN_FINDS = Fact("login_finds", _login_finds_script, _login_finds)  # LOGIN_FINDS((program, ...))
