"""shell: a POSIX login shell on every node, and the nodeprep env file reaching NON-interactive
ssh shells (what pdsh and mpirun start): a block at the TOP of ~/.bashrc, before Debian's
"If not running interactively, don't do anything" guard, and ~/.zshenv for zsh."""

from __future__ import annotations

import os
import re
import shlex

from nodeprep.engine.facts import ETC_SHELLS, FILE, LOGIN_SHELL, USER
from nodeprep.engine.remote import rpath
from nodeprep.engine.steps import FileBlock, Step, StepCheck
from nodeprep.errors import InputError
from nodeprep.ops.provision.shells import NON_POSIX, want_shell


def validate(prov):
    for node, v in prov.vars.items():
        want = v["login_shell"]
        if not want:
            continue
        file, line = prov.origin(node, "login_shell")
        if not re.fullmatch(r"/[A-Za-z0-9_@+=:,./-]*", str(want)):
            raise InputError(
                f"login_shell: {str(want)[:60]!r} is not an absolute path of a shell",
                hint="e.g. /bin/bash, as listed in the node's /etc/shells",
                file=file,
                line=line,
            )
        if os.path.basename(want) in NON_POSIX:
            raise InputError(
                f"login_shell: {want} is not a POSIX shell: pdsh, mpirun and "
                f"DeepSpeed send `export K=V; ...` to the login shell, and the env "
                f"file {v['env_file']} is sh syntax",
                hint="use /bin/bash, /bin/zsh or /bin/sh",
                file=file,
                line=line,
            )


def source_line(env_file: str) -> str:
    p = rpath(env_file)
    return f"[ -f {p} ] && . {p}\n"


FACTS = [LOGIN_SHELL, ETC_SHELLS, USER]


def reads(ctx):
    return [FILE("~/.bashrc"), FILE("~/.zshenv")]


def steps(ctx):
    f, v = ctx.facts, ctx.vars
    want = want_shell(v, f[LOGIN_SHELL])
    user = f[USER]["name"]
    q = shlex.quote

    def check(facts):
        if facts[LOGIN_SHELL] == want:
            return StepCheck(True)
        if want not in facts[ETC_SHELLS]:
            return StepCheck(
                False,
                f"{want} is not in /etc/shells (listed: "
                f"{', '.join(facts['etc_shells']) or 'none'})",
            )
        return StepCheck(False, f"login shell is {facts['login_shell']}, want {want}")

    # usermod as root, else through passwordless sudo; never an interactive prompt.
    action = (
        f'if [ "$(id -u)" -eq 0 ]; then usermod -s {q(want)} {q(user)}; '
        f"else sudo -n /usr/sbin/usermod -s {q(want)} {q(user)} || {{ echo 'cannot change "
        f"the login shell: not root and no passwordless sudo for usermod' >&2; exit 1; }}; fi"
    )
    fixable = want in f[ETC_SHELLS]
    hint = (
        f"fallback: ask an admin to run `chsh -s {want} {user}`, or for tcsh add "
        f"`if ( -x {want} ) exec {want} -l` to ~/.login"
    )
    out = [
        Step(
            f"user.shell {want}",
            [LOGIN_SHELL, ETC_SHELLS],
            check,
            action=action if fixable else None,
            hint=hint
            if fixable
            else f"install {want} and list it in /etc/shells, or set login_shell to a listed shell",
            scope="machine",
        )
    ]  # /etc/passwd is the machine's
    line = source_line(v["env_file"])
    out.append(FileBlock("~/.bashrc", "env", line, where="top"))
    if os.path.basename(want) == "zsh":
        out.append(FileBlock("~/.zshenv", "env", line, where="top"))
    return out
