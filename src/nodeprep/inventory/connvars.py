"""Every connection variable Ansible's ssh connection reads, in one table: used (and as what),
ignored (why it changes nothing nodeprep does), or refused (what to write instead).

The list is Ansible's own: the `vars:` of every option in `ansible-doc -t connection ssh --json` and
`ansible-doc -t become sudo --json` (ansible-core 2.19), plus ansible_connection, ansible_become,
ansible_become_method (and the old ansible_sudo) and ansible_python_interpreter.
tests/unit/test_connvars.py derives the list from the installed ansible-core and fails on a variable
this table does not classify, so a new release cannot add a silent drop.

Spellings: where Ansible has two names for one option, its `vars:` list is in precedence order
and the LAST one defined wins (ansible.config.manager's _loop_entries; the same as PlayContext's
MAGIC_VARIABLE_MAPPING, which tries the ansible_ssh_* name first): ansible_ssh_host over
ansible_host, ansible_ssh_port over ansible_port, ansible_ssh_user over ansible_user,
ansible_ssh_private_key_file over ansible_private_key_file, whatever level (host, group, all)
each is set at. STRONG lists them; inventory.model applies it after the levels are merged.

A refused variable fails a command that selects the host (commands.common), in one line with
the host, the variable, its file:line and the fix; `invoke inventory --host` lists every
variable with its class."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

USED = "used"
IGNORED = "ignored"
REFUSED = "refused"


@dataclass(frozen=True)
class Rule:
    status: str
    text: str  # USED: what it becomes; IGNORED: why; REFUSED: what to write instead


def _rules(names: str, status: str, text: str) -> dict[str, Rule]:
    return {n: Rule(status, text) for n in names.split()}


_PASSWORD = (
    "a password: put a key on the node (ssh-copy-id -i KEY.pub USER@HOST) and give "
    "ansible_ssh_private_key_file, or load it into ssh-agent; `provision --ask-pass` takes a "
    "password for a first contact, never from a file"
)
_TRANSFER = "files travel over nodeprep's own sftp and relay"
TABLE: dict[str, Rule] = {
    **_rules(
        "ansible_host ansible_ssh_host", USED, "address (ansible_ssh_host wins when both are set)"
    ),
    **_rules(
        "ansible_port ansible_ssh_port", USED, "port (ansible_ssh_port wins when both are set)"
    ),
    **_rules(
        "ansible_user ansible_ssh_user", USED, "user (ansible_ssh_user wins when both are set)"
    ),
    **_rules(
        "ansible_private_key_file ansible_ssh_private_key_file",
        USED,
        "key (ansible_ssh_private_key_file wins when both are set)",
    ),
    "ansible_python_interpreter": Rule(USED, "python: the interpreter the venv is built from"),
    "ansible_connection": Rule(
        USED,
        "connection: ssh (ssh, smart, paramiko), or local for the controller "
        "itself; any other is refused",
    ),
    **_rules(
        "ansible_ssh_common_args ansible_ssh_extra_args ansible_ssh_args",
        USED,
        "ssh options: the jump host (-J, -o ProxyJump, a plain ssh -W ProxyCommand); "
        "an option that picks another address, port, user, key or config file is refused; "
        "the others change nothing nodeprep does",
    ),
    **_rules("ansible_password ansible_ssh_pass ansible_ssh_password", REFUSED, _PASSWORD),
    **_rules(
        "ansible_private_key ansible_ssh_private_key",
        REFUSED,
        "a key's text in the inventory: write it to a file (chmod 600) and give its path as "
        "ansible_ssh_private_key_file",
    ),
    **_rules(
        "ansible_private_key_passphrase ansible_ssh_private_key_passphrase",
        REFUSED,
        "a passphrase in the inventory: load the key into ssh-agent (ssh-add KEY) and remove it",
    ),
    "ansible_ssh_pkcs11_provider": Rule(
        REFUSED,
        "a PKCS#11 token: load its keys into ssh-agent "
        "(ssh-add -s PROVIDER) and remove this variable",
    ),
    "ansible_ssh_executable": Rule(
        REFUSED,
        "another ssh program: nodeprep connects with its own client "
        "(and OpenSSH for the launchers); remove it, a jump host goes in "
        "proxy_jump",
    ),
    **_rules(
        "ansible_host_key_checking ansible_ssh_host_key_checking",
        IGNORED,
        "host keys are always pinned: the first contact pins a node's key, "
        "a changed one is refused",
    ),
    **_rules(
        "ansible_ssh_password_mechanism ansible_sshpass_prompt",
        IGNORED,
        "only for passwords, which nodeprep does not take from an inventory",
    ),
    **_rules(
        "ansible_pipelining ansible_ssh_pipelining",
        IGNORED,
        "nodeprep sends each node one script per round trip",
    ),
    **_rules(
        "ansible_control_path ansible_control_path_dir",
        IGNORED,
        "nodeprep keeps one connection per node for the run",
    ),
    "ansible_ssh_retries": Rule(
        IGNORED, "nodeprep retries a refused or reset connection itself (nodeprep.connect_retries)"
    ),
    "ansible_ssh_timeout": Rule(
        IGNORED, "the connect timeout is --connect-timeout (nodeprep.connect_timeout)"
    ),
    **_rules(
        "ansible_scp_executable ansible_scp_extra_args ansible_sftp_batch_mode "
        "ansible_sftp_executable ansible_sftp_extra_args ansible_ssh_transfer_method",
        IGNORED,
        _TRANSFER,
    ),
    "ansible_ssh_use_tty": Rule(IGNORED, "nodeprep's commands need no terminal"),
    "ansible_ssh_verbosity": Rule(
        IGNORED, "nodeprep logs every node's session in its run directory"
    ),
    **_rules(
        "ansible_become ansible_sudo",
        IGNORED,
        "nodeprep runs `sudo -n` only where a role needs root (the login shell change), and only "
        "when the user is not root",
    ),
    **_rules("ansible_become_method", IGNORED, "sudo, as nodeprep escalates"),
    **_rules("ansible_become_user ansible_sudo_user", IGNORED, "root, as nodeprep escalates"),
    **_rules(
        "ansible_become_exe ansible_become_flags ansible_sudo_exe ansible_sudo_flags",
        IGNORED,
        "nodeprep runs `sudo -n` from the node's PATH",
    ),
    "ansible_sudo_chdir": Rule(IGNORED, "nodeprep's commands run in the user's home"),
    **_rules(
        "ansible_become_password ansible_become_pass ansible_sudo_pass",
        REFUSED,
        "a sudo password: allow the user `usermod -s SHELL USER` without one (sudoers NOPASSWD), "
        "or set login_shell to the shell the user has",
    ),
}

# The ansible_ssh_* spelling wins over the plain one (see the module's docstring).
STRONG = {
    "ansible_ssh_host": "address",
    "ansible_ssh_port": "port",
    "ansible_ssh_user": "user",
    "ansible_ssh_private_key_file": "key",
}
WEAK = {
    "ansible_host": "address",
    "ansible_port": "port",
    "ansible_user": "user",
    "ansible_private_key_file": "key",
    "ansible_python_interpreter": "python",
    "ansible_connection": "connection",
}

# ssh options (in ansible_ssh_*args) that would send nodeprep elsewhere than the inventory says
_FLAG_FIX = {
    "-i": "ansible_ssh_private_key_file",
    "-l": "ansible_user",
    "-p": "ansible_port",
    "-F": "the options themselves in the inventory",
}
_OPTION_FIX = {
    "user": "ansible_user",
    "port": "ansible_port",
    "hostname": "ansible_host",
    "identityfile": "ansible_ssh_private_key_file",
    "certificatefile": "ssh-agent (ssh-add KEY)",
}
_WITH_ARG = set("BbcDEeFIiJLlmOopQRSWw")


def classify(name: str, value) -> Rule | None:
    """The rule for variable NAME set to VALUE, None for a variable that is not Ansible's
    connection's (a playbook variable: kept, not used). Value-dependent: a become method other
    than sudo, a become user other than root, ssh options that pick another target."""
    rule = TABLE.get(name)
    if rule is None:
        return None
    text = "" if value is None else str(value).strip()
    if name == "ansible_become_method" and text not in ("", "sudo"):
        return Rule(
            REFUSED,
            f"become method {text!r}: nodeprep escalates with `sudo -n` only; give the "
            "user passwordless sudo for `usermod -s SHELL USER`, or set login_shell to the "
            "shell it has",
        )
    if name in ("ansible_become_user", "ansible_sudo_user") and text not in ("", "root"):
        return Rule(
            REFUSED,
            f"become user {text!r}: nodeprep acts as the login user and escalates to root "
            "only; log in as that user instead (ansible_user)",
        )
    if name in ("ansible_ssh_common_args", "ansible_ssh_extra_args", "ansible_ssh_args"):
        why = ssh_args_problem(text)
        if why:
            return Rule(REFUSED, why)
    return rule


def ssh_args_problem(text: str) -> str | None:
    """Why ssh options TEXT would reach another target than the inventory says, or None."""
    try:
        words = shlex.split(text)
    except ValueError:
        return None  # jumps.py says what is wrong with the quoting
    i = 0
    while i < len(words):
        w = words[i]
        if len(w) >= 2 and w[0] == "-" and w[1] in _WITH_ARG:
            arg = w[2:] or (words[i + 1] if i + 1 < len(words) else "")
            i += 1 if w[2:] else 2
            flag = w[:2]
            if flag in _FLAG_FIX:
                return (
                    f"ssh option {flag} {arg}: nodeprep would not use it; "
                    f"write {_FLAG_FIX[flag]} instead"
                )
            if flag == "-o":
                key = arg.replace("=", " ", 1).split(None, 1)[0].lower() if arg.strip() else ""
                if key in _OPTION_FIX:
                    return (
                        f"ssh option -o {arg}: nodeprep would not use it; "
                        f"write {_OPTION_FIX[key]} instead"
                    )
            continue
        i += 1
    return None


def ansible_names() -> set[str]:
    """Every variable the table classifies."""
    return set(TABLE)
