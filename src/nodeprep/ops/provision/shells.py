"""The login shell the shell role sets, one rule for the role and for `invoke doctor` (which
asks whether sudo can make that change): the inventory's login_shell, else the node's current
shell when it is POSIX, else /bin/bash. csh, tcsh and fish are not POSIX: pdsh, mpirun and
DeepSpeed send `export K=V; ...` to the login shell."""

from __future__ import annotations

import os

NON_POSIX = ("csh", "tcsh", "fish")


def want_shell(v: dict, current: str | None) -> str:
    if v.get("login_shell"):
        return str(v["login_shell"])
    if current and os.path.basename(current) not in NON_POSIX:
        return current
    return "/bin/bash"
