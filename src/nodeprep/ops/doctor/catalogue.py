"""Every doctor check by name (`invoke doctor --list-checks`), the codes it can give, and the
selection --check makes. tier "controller": RUN(View); tier "node": RUN([Contact]) over the
fleet's first contacts (health's CheckSpec, its `fleet` form)."""

from __future__ import annotations

from nodeprep.errors import InputError
from nodeprep.ops.doctor import connection, node
from nodeprep.ops.doctor import controller as ctl
from nodeprep.ops.health.findings import CheckSpec

CHECKS: tuple[CheckSpec, ...] = (
    CheckSpec(
        "inventory",
        "the inventory loads and nodeprep can reach every selected node the way it says "
        "(connection, jump form, key file, Ansible connection variables)",
        codes={
            "INVENTORY_REFUSED": "a host or value nodeprep refuses (the node checks do not run)"
        },
        run=ctl.inventory,
        tier="controller",
    ),
    CheckSpec(
        "ssh_keys",
        "the key files the inventory names (else ~/.ssh/id_*) exist, private modes, "
        "usable without a passphrase prompt",
        codes={
            "SSH_DIR_MODE": "~/.ssh writable by others",
            "KEY_MISSING": "a key: file that does not exist",
            "KEY_MODE": "a private key readable by others",
            "KEY_LOCKED": "a passphrase and no agent",
            "NO_KEY": "no key at all",
        },
        run=ctl.ssh_keys,
        tier="controller",
    ),
    CheckSpec(
        "ssh_agent",
        "an ssh-agent, if SSH_AUTH_SOCK names one, answers",
        codes={"AGENT_DEAD": "SSH_AUTH_SOCK set, nothing answers"},
        run=ctl.ssh_agent,
        tier="controller",
    ),
    CheckSpec(
        "ssh_config",
        "the controller's ssh config: readable, private, no block of a removed "
        "inventory, no alias of this inventory defined elsewhere as another machine",
        codes={
            "CONFIG_UNREADABLE": "cannot be read",
            "CONFIG_MODE": "writable by others",
            "BLOCK_STALE": "a block whose inventory is gone",
            "ALIAS_CONFLICT": "an alias defined elsewhere",
        },
        run=ctl.ssh_config,
        tier="controller",
    ),
    CheckSpec(
        "labs",
        "no emulated lab left half up or half down",
        codes={"LAB_LEFTOVER": "a lab's leftovers"},
        run=ctl.labs,
        tier="controller",
    ),
    CheckSpec(
        "python_deps",
        "the controller's Python and requirements/tool.txt's pins",
        codes={
            "PYTHON_OLD": "older than 3.10",
            "DEP_MISSING": "a pinned package missing",
            "DEP_VERSION": "a pinned package at another version",
        },
        run=ctl.python_deps,
        tier="controller",
    ),
    CheckSpec(
        "reach",
        "every node answers on its ssh port",
        codes={"NODE_UNREACHABLE": "no answer, refused, or down"},
        run=connection.reach,
        fleet=True,
        tier="node",
    ),
    CheckSpec(
        "auth",
        "the inventory's user and key log in",
        codes={
            "AUTH_FAILED": "every key refused",
            "AUTH_PASSWORD": "a password login (launchers cannot type it)",
        },
        run=connection.auth,
        fleet=True,
        tier="node",
    ),
    CheckSpec(
        "host_key",
        "each node's host key is the pinned one (pinned now at first contact)",
        codes={
            "HOST_KEY_CHANGED": "differs from the pinned key",
            "HOST_KEY_UNPINNED": "unknown, pinning off",
        },
        run=connection.host_key,
        fleet=True,
        tier="node",
    ),
    CheckSpec(
        "sudo",
        "passwordless sudo where a role needs it (the login shell change)",
        codes={
            "SUDO_MISSING": "the shell must change and sudo cannot",
            "SUDO_UNKNOWN": "sudo did not answer",
        },
        run=node.sudo,
        fleet=True,
        tier="node",
    ),
    CheckSpec(
        "python",
        "the inventory's python runs, is 3.10+, one version across the fleet",
        codes={
            "PYTHON_MISSING": "does not run",
            "PYTHON_OLD": "older than 3.10",
            "PYTHON_MISMATCH": "another version",
        },
        run=node.python,
        fleet=True,
        tier="node",
    ),
    CheckSpec(
        "modules",
        "where the inventory names `modules`: a module system, and each module loads as the "
        "ranks' shells will load it",
        codes={
            "MODULE_NOT_LOADED": "one does not load (what the node has instead, and the fix)",
            "MODULES_NO_SYSTEM": "nothing defines `module` (the fix: module_init, or install one)",
            "MODULES_UNKNOWN": "the modules probe gave no answer",
        },
        run=node.modules,
        fleet=True,
        tier="node",
    ),
    CheckSpec(
        "launchers",
        "pdsh (and mpirun, orted where Open MPI is) on the non-interactive PATH pdsh "
        "and mpirun use",
        codes={
            "NOT_ON_PATH": "missing there (the fix: where a login shell finds it, else the package)"
        },
        run=node.launchers,
        fleet=True,
        tier="node",
    ),
    CheckSpec(
        "disk",
        "room for the wheelhouse and the venv where venv_path is",
        codes={
            "DISK_LOW": "less free than a provision needs",
            "DISK_READONLY": "not writable",
            "DISK_UNKNOWN": "could not be read",
        },
        run=node.disk,
        fleet=True,
        tier="node",
    ),
)

COMMON = {
    "CHECK_CRASHED": "the check itself failed on what it was given (the others still ran)",
    "NOT_CHECKED": "a node that was not reached (UNKNOWN to every check past reach/auth/host_key)",
}


def select(names) -> tuple[CheckSpec, ...]:
    known = {c.name: c for c in CHECKS}
    bad = [n for n in names if n not in known]
    if bad:
        raise InputError(
            f"--check {bad[0]}: no such check",
            hint="invoke doctor --list-checks names them: " + ", ".join(known),
        )
    return tuple(known[n] for n in names) if names else CHECKS
