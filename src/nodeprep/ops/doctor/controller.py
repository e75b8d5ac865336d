"""The controller's side of `invoke doctor`: the checks, pure functions of the controller's
`View` (controller_view.py: the keys and their modes, the ssh-agent, the controller's ssh
config with its managed blocks, the Python and the tool's dependencies) that return (code,
verdict, reason, fix) tuples with the exact command that fixes each finding."""

from __future__ import annotations

from nodeprep.ops.doctor.controller_view import View
from nodeprep.ops.health.findings import Verdict

MIN_PYTHON = (3, 10)  # the controller's own floor (requirements/tool.txt's pins need it)


# -- checks ---------------------------------------------------------------------------------


def _loose(mode: int | None, mask: int) -> bool:
    return mode is not None and bool(mode & mask)


def _key_finding(k, v: View) -> tuple | None:
    """Key file K's finding, if it has one: missing, readable by others, or locked with no
    agent key to use instead."""
    if not k.exists:
        return (
            "KEY_MISSING",
            Verdict.CRITICAL,
            f"{k.path} ({k.named}) does not exist",
            f"ssh-keygen -t ed25519 -N '' -f {k.path}  "
            f"(then ssh-copy-id -i {k.path}.pub to each node)",
        )
    elif _loose(k.mode, 0o077):
        return (
            "KEY_MODE",
            Verdict.CRITICAL,
            f"{k.path} is readable by others (mode {k.mode:04o}): "
            "OpenSSH refuses it (UNPROTECTED PRIVATE KEY FILE)",
            f"chmod 600 {k.path}",
        )
    elif k.encrypted and (v.agent_rc != 0 or not v.agent_keys):
        return (
            "KEY_LOCKED",
            Verdict.WARN,
            f"{k.path} has a passphrase and no ssh-agent holds a key: nodeprep cannot use it",
            f'eval "$(ssh-agent -s)" && ssh-add {k.path}',
        )
    return None


def ssh_keys(v: View) -> list:
    out = []
    if _loose(v.ssh_dir_mode, 0o022):
        out.append(
            (
                "SSH_DIR_MODE",
                Verdict.CRITICAL,
                f"{v.ssh_dir} is writable by others (mode "
                f"{v.ssh_dir_mode:04o}): OpenSSH and sshd refuse keys and configs there",
                f"chmod 700 {v.ssh_dir}",
            )
        )
    out += filter(None, (_key_finding(k, v) for k in v.keys))
    if not v.keys and not v.agent_keys:
        out.append(
            (
                "NO_KEY",
                Verdict.CRITICAL,
                "no key: none in the inventory, no ~/.ssh/id_*, no agent key",
                "ssh-keygen -t ed25519 -N '' -f ~/.ssh/id_ed25519  (then ssh-copy-id to each node)",
            )
        )
    return out or [
        (
            "KEYS_OK",
            Verdict.OK,
            f"{len(v.keys)} key file(s), private modes"
            + (f"; the agent holds {v.agent_keys}" if v.agent_keys else ""),
            "",
        )
    ]


def ssh_agent(v: View) -> list:
    if v.agent_sock is None:
        return [
            (
                "AGENT_NONE",
                Verdict.OK,
                "no ssh-agent (nodeprep uses the key files; fine unless a key has a passphrase)",
                "",
            )
        ]
    if v.agent_rc == 2:
        return [
            (
                "AGENT_DEAD",
                Verdict.WARN,
                f"SSH_AUTH_SOCK={v.agent_sock} but no agent answers there",
                'eval "$(ssh-agent -s)"  (or: unset SSH_AUTH_SOCK)',
            )
        ]
    return [("AGENT_OK", Verdict.OK, f"ssh-agent answers, {v.agent_keys} key(s)", "")]


def _clash_fix(d, v: View, blocks: dict) -> str:
    if d.block is not None and not blocks.get(d.block, True):
        return "invoke ssh.prune  (that block's inventory no longer exists)"
    where = f"the block of '{d.block}'" if d.block else f"your entry at {d.where}"
    want = f"{v.label}-" if v.prefix != f"{v.label}-" else f"{v.label}2-"
    return (
        f"remove {where}, or set `ssh_alias_prefix: {want}` in this inventory's vars "
        f"(now '{v.prefix}')"
    )


def ssh_config(v: View) -> list:
    out = []
    if v.config_error:
        out.append(
            (
                "CONFIG_UNREADABLE",
                Verdict.CRITICAL,
                f"{v.config_path}: {v.config_error}",
                f"chmod 600 {v.config_path}",
            )
        )
    if _loose(v.config_mode, 0o022):
        out.append(
            (
                "CONFIG_MODE",
                Verdict.CRITICAL,
                f"{v.config_path} is writable by others (mode "
                f"{v.config_mode:04o}): ssh refuses it (Bad owner or permissions)",
                f"chmod 600 {v.config_path}",
            )
        )
    alive = {name: ok for name, _line, ok in v.blocks}
    for name, line, ok in v.blocks:
        if not ok:
            out.append(
                (
                    "BLOCK_STALE",
                    Verdict.WARN,
                    f"{v.config_path}:{line}: the block of inventory "
                    f"'{name}', which no longer exists: its aliases still send ssh somewhere",
                    "invoke ssh.prune",
                )
            )
    for a in v.aliases:
        for d in a.clashes:
            out.append(
                (
                    "ALIAS_CONFLICT",
                    Verdict.CRITICAL,
                    f"Host {a.alias} is defined at {d.where} as "
                    f"{d.hostname or a.alias}:{d.port or 22}; "
                    f"this inventory has it at {a.address}:{a.port} "
                    "(provision refuses; ssh takes the first)",
                    _clash_fix(d, v, alive),
                )
            )
    return out or [
        (
            "CONFIG_OK",
            Verdict.OK,
            f"{v.config_path}: {len(v.blocks)} managed block(s), no stale one"
            + (f", {len(v.aliases)} alias(es) free" if v.aliases else ""),
            "",
        )
    ]


def python_deps(v: View) -> list:
    out = []
    if tuple(v.python[:2]) < MIN_PYTHON:
        out.append(
            (
                "PYTHON_OLD",
                Verdict.CRITICAL,
                f"Python {'.'.join(map(str, v.python))} runs nodeprep; "
                f"it needs {MIN_PYTHON[0]}.{MIN_PYTHON[1]}+",
                "sh requirements/bootstrap.sh",
            )
        )
    for name, pinned, have in v.deps:
        if have is None:
            out.append(
                (
                    "DEP_MISSING",
                    Verdict.CRITICAL,
                    f"{name} is not installed (pinned {pinned})",
                    "sh requirements/bootstrap.sh",
                )
            )
        elif have != pinned:
            out.append(
                (
                    "DEP_VERSION",
                    Verdict.WARN,
                    f"{name} {have} installed, {pinned} pinned in requirements/tool.txt",
                    "sh requirements/bootstrap.sh",
                )
            )
    return out or [
        (
            "DEPS_OK",
            Verdict.OK,
            f"Python {'.'.join(map(str, v.python))}; {len(v.deps)} pinned "
            "dependencies at their versions",
            "",
        )
    ]


def inventory(v: View) -> list:
    if v.inventory_error:
        return [("INVENTORY_REFUSED", Verdict.CRITICAL, v.inventory_error[0], v.inventory_error[1])]
    if v.inventory is None:
        return [("NO_INVENTORY", Verdict.OK, "no inventory selected: the controller only", "")]
    return [("INVENTORY_OK", Verdict.OK, f"{v.hosts} node(s) selected from {v.inventory}", "")]


def labs(v: View) -> list:
    out = [
        ("LAB_LEFTOVER", Verdict.WARN, f"lab {name}: {problem}", fix)
        for name, problem, fix in v.labs
    ]
    return out or [("LABS_OK", Verdict.OK, "no lab left half up", "")]
