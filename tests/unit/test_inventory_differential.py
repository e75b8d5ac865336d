"""nodeprep reads Ansible inventories exactly as Ansible does: a differential test.

Every entry of tests/inventories/ (one inventory file, or one inventory directory: several
sources side by side plus group_vars/ and host_vars/) is read by the reference
`ansible-inventory --list` (requirements/ansible.txt, installed into .venv-ansible/ by
requirements/bootstrap.sh) and by `invoke inventory --list --json`, and both results are
reduced to the same view:

  hosts:  {name: (address, port, user, jump, key, python, connection)}: address, port, user and
          key as Ansible's ssh connection resolves them from the host's variables: each option's
          `vars:` list from `ansible-doc -t connection ssh --json`, the last one defined winning
          (ansible_ssh_user over ansible_user at any level; the name, 22, None, None when none
          is); a relative key joined to the inventory's directory (where nodeprep resolves it:
          Ansible would take its working directory); python = ansible_python_interpreter;
          connection = ansible_connection (smart and paramiko are ssh), ssh when unset;
          jump = the jump chain OpenSSH itself reads from the host's ansible_ssh_common_args +
          ansible_ssh_extra_args (`ssh -G ARGS HOST`: its proxyjump, or the hop a plain
          `ssh -W` proxycommand is)
  groups: {group: sorted hosts in it, directly or through its children}, every group but
          `all`; a group with no host at all is left out on both sides, because
          ansible-inventory --list omits groups without hosts and children (and lists an
          empty group only as a name among its parent's children)

An entry Ansible refuses must be refused by nodeprep: exit code 2 and no traceback.
Entries named bad_* are the ones Ansible refuses (test_corpus_names_match_ansible checks it).

Ansible runs with unparsed sources made fatal, only the script, yaml and ini plugins
enabled, an empty config file and one temporary directory per test process as home and local
temp, and a fresh empty directory as working directory for every run (so nothing from the
machine or the repo leaks in). The runs are forked from a server that has imported
ansible-inventory once (tests/ansible_oracle.py; test_ansible_oracle.py holds its runs equal to
real ansible-inventory processes). An executable entry is an inventory script; a `.json` entry
named *script_output* is what a script prints, saved, and Ansible is given a script that prints
it (output_script): Ansible itself reads a .json file with its yaml plugin only, which refuses
that shape.
"""

from __future__ import annotations

import difflib
import json
import os
import shlex
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from nodeprep.commands.inventory import InventoryView
from nodeprep.inventory import fields
from nodeprep.inventory.model import load
from tests import ansible_oracle

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "inventories"
ANSIBLE_INVENTORY = ROOT / ".venv-ansible" / "bin" / "ansible-inventory"
INVOKE = ROOT / ".venv" / "bin" / "invoke"
NOT_ENTRIES = {"README.md"}
ENTRIES = sorted(
    p.name for p in CORPUS.iterdir() if p.name not in NOT_ENTRIES and not p.name.startswith(".")
)
TIMEOUT = 120


@dataclass
class Run:
    argv: list[str]
    rc: int
    stdout: str
    stderr: str

    def describe(self) -> str:
        return (
            f"$ {' '.join(self.argv)}\nexit code {self.rc}\n"
            f"--- stderr ---\n{self.stderr.strip()}\n--- stdout (start) ---\n{self.stdout[:2000]}"
        )


def require_ansible() -> None:
    if not os.access(ANSIBLE_INVENTORY, os.X_OK):
        pytest.fail(
            f"{ANSIBLE_INVENTORY.relative_to(ROOT)} is missing: the reference Ansible "
            f"is not installed; run `sh requirements/bootstrap.sh`",
            pytrace=False,
        )


# The environment the runs get, copied once here: these runs start from a thread pool while
# pytest rewrites PYTEST_CURRENT_TEST in os.environ for every test phase, and a child started
# with the live environment (env=None, vfork) can read the array as it is replaced: execve
# then fails with EFAULT ("OSError: [Errno 14] Bad address", seen twice in full suites).
RUN_ENV = dict(os.environ)


def is_script_output(entry: str) -> bool:
    """A `.json` entry named *script_output*: what an inventory script prints, saved."""
    return entry.endswith(".json") and "script_output" in entry


def output_script(output: Path, folder: Path) -> Path:
    """A script in FOLDER that prints OUTPUT for `--list` and `{}` for `--host NAME`: how
    Ansible reads saved script output (it reads a .json file only with its yaml plugin,
    which refuses the script shape)."""
    script = folder / "inventory_script.sh"
    script.write_text(
        f'#!/bin/sh\nif [ "$1" = --list ]; then exec cat {shlex.quote(str(output))}; fi\n'
        "echo '{}'\n"
    )
    script.chmod(0o755)
    return script


def run_ansible(entry: str) -> Run:
    return ansible_list(CORPUS / entry, script_output=is_script_output(entry))


def ansible_list(source: Path, script_output: bool = False) -> Run:
    """`ansible-inventory -i SOURCE --list` (SOURCE: saved script output when SCRIPT_OUTPUT)."""
    session = ansible_oracle.shared(ANSIBLE_INVENTORY, RUN_ENV)
    # cwd is a fresh empty directory: ansible-inventory would read group_vars/ and host_vars/
    # (and ansible.cfg) from its working directory too
    cwd = session.new_cwd()
    try:
        source = output_script(source, cwd) if script_output else source
        argv = [str(ANSIBLE_INVENTORY), "-i", str(source), "--list"]
        r = session.oracle.run(argv, cwd, TIMEOUT)
    finally:
        shutil.rmtree(cwd, ignore_errors=True)
    return Run(argv, r.rc, ansible_oracle.as_text(r.stdout), ansible_oracle.as_text(r.stderr))


def run_nodeprep(entry: str) -> Run:
    argv = [
        str(INVOKE),
        "inventory",
        "--inventory",
        f"tests/inventories/{entry}",
        "--list",
        "--json",
    ]
    r = subprocess.run(argv, cwd=ROOT, env=RUN_ENV, capture_output=True, text=True, timeout=TIMEOUT)
    return Run(argv, r.returncode, r.stdout, r.stderr)


RUNNERS = {"ansible": run_ansible, "nodeprep": run_nodeprep}


class Runs:
    """Each (tool, entry) run once per test session, all of them started at once."""

    def __init__(self, pool: ThreadPoolExecutor):
        self._pool = pool
        self._futures = {}

    def start(self, tool: str, entry: str):
        key = (tool, entry)
        if key not in self._futures:
            self._futures[key] = self._pool.submit(RUNNERS[tool], entry)
        return self._futures[key]

    def get(self, tool: str, entry: str) -> Run:
        return self.start(tool, entry).result()


@pytest.fixture(scope="module")
def runs(request):
    tools = {
        "test_reads_like_ansible": ("ansible", "nodeprep"),
        "test_corpus_names_match_ansible": ("ansible",),
    }
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        r = Runs(pool)
        # start every run the selected tests will need, so they overlap
        for item in request.session.items:
            params = getattr(getattr(item, "callspec", None), "params", {})
            for tool in tools.get(getattr(item, "originalname", ""), ()):
                if "entry" in params and (
                    tool != "ansible" or os.access(ANSIBLE_INVENTORY, os.X_OK)
                ):
                    r.start(tool, params["entry"])
        yield r
        pool.shutdown(cancel_futures=True)


def _members(groups: dict[str, dict], name: str, seen: frozenset = frozenset()) -> set[str]:
    body = groups.get(name) or {}
    hosts = set(body.get("hosts") or ())
    for child in body.get("children") or ():
        if child not in seen:
            hosts |= _members(groups, child, seen | {name})
    return hosts


def _view(hosts: dict[str, tuple], groups: dict[str, dict]) -> dict:
    members = {g: sorted(_members(groups, g)) for g in groups if g != "all"}
    return {
        "hosts": dict(sorted(hosts.items())),
        "groups": {g: m for g, m in sorted(members.items()) if m},
    }


_ORDER: dict[str, list[str]] = {}


def ssh_option_vars(option: str) -> list[str]:
    """The ansible_* variables of ssh connection OPTION, in Ansible's precedence order (the
    last one defined wins), from the installed ansible-core's own documentation."""
    if not _ORDER:
        r = subprocess.run(
            [str(ANSIBLE_INVENTORY.with_name("ansible-doc")), "-t", "connection", "ssh", "--json"],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            env=RUN_ENV,
        )
        opts = json.loads(r.stdout)["ssh"]["doc"]["options"]
        _ORDER.update(
            {
                k: [v["name"] for v in o.get("vars", []) if v["name"].startswith("ansible_")]
                for k, o in opts.items()
            }
        )
    return _ORDER[option]


def resolve(hv: dict, option: str):
    found = [hv[v] for v in ssh_option_vars(option) if hv.get(v) is not None]
    return found[-1] if found else None


def ansible_json(text: str):
    """ansible-inventory's JSON as Ansible's own decoder reads it: `{"__ansible_unsafe": S}`
    (a string Ansible will not template, e.g. a malformed group's variables) is S."""
    return json.loads(
        text, object_hook=lambda d: d["__ansible_unsafe"] if "__ansible_unsafe" in d else d
    )


def ansible_view(out: dict, base: Path) -> dict:
    hostvars = out["_meta"]["hostvars"]
    groups = {name: body for name, body in out.items() if name != "_meta"}
    names = set(hostvars).union(*(_members(groups, g) for g in groups))
    hosts = {}
    for name in names:
        hv = hostvars.get(name, {})
        address, port, user, key = (
            resolve(hv, o) for o in ("host", "port", "remote_user", "private_key_file")
        )
        python = hv.get("ansible_python_interpreter")
        conn = str(hv.get("ansible_connection") or "ssh").strip()
        hosts[name] = (
            name if address is None else str(address),
            22 if port is None else int(port),
            None if user is None else str(user),
            openssh_jump(
                " ".join(
                    str(hv.get(k) or "")
                    for k in ("ansible_ssh_common_args", "ansible_ssh_extra_args")
                )
            ),
            None if key is None else str(base / Path(str(key)).expanduser()),
            None if python is None else str(python),
            {"smart": "ssh", "paramiko": "ssh", "paramiko_ssh": "ssh"}.get(conn, conn),
        )
    return _view(hosts, groups)


def entry_base(entry: str) -> Path:
    path = CORPUS / entry
    return path if path.is_dir() else path.parent


def openssh_jump(args: str) -> str | None:
    """The jump chain OpenSSH reads from ssh arguments ARGS (`ssh -G`), as hops joined by ','."""
    from nodeprep.inventory import jumps

    if "proxyjump" not in args.lower() and "proxycommand" not in args.lower() and "-J" not in args:
        return None
    r = subprocess.run(
        ["ssh", "-G", "-F", "/dev/null", *shlex.split(args), "oracle-host"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    said = dict(ln.split(" ", 1) for ln in r.stdout.splitlines() if " " in ln)
    if said.get("proxyjump", "none") != "none":
        return ",".join(str(h) for h in jumps.parse_chain(said["proxyjump"]))
    if said.get("proxycommand", "none") != "none":
        hop = jumps.hop_of_command(said["proxycommand"])
        return str(hop) if hop else "unsupported: " + said["proxycommand"]
    return None


def nodeprep_view(out: dict) -> dict:
    hosts = {
        name: (
            h["address"],
            h["port"],
            h["user"],
            h.get("jump"),
            h["key"],
            None if h["vars"].get("python") is None else str(h["vars"]["python"]),
            h["connection"],
        )
        for name, h in out["hosts"].items()
    }
    return _view(hosts, out["groups"])


def unsafe_fields(view: dict) -> list[str]:
    """The names, addresses and users in VIEW that nodeprep refuses (inventory.fields)."""
    out = []
    for name, (address, _port, user, *_rest) in view["hosts"].items():
        out += [name] if fields.name_problem(name) else []
        out += [address] if fields.address_problem(address) else []
        out += [user] if user is not None and fields.user_problem(user) else []
    return out


def render(view: dict) -> list[str]:
    lines = [
        f"host {name}: address={a} port={p} user={u}"
        + (f" jump={j}" if j else "")
        + (f" key={k}" if k else "")
        + (f" python={py}" if py else "")
        + (f" connection={c}" if c != "ssh" else "")
        for name, (a, p, u, j, k, py, c) in view["hosts"].items()
    ]
    lines += [f"group {g}: {' '.join(m)}" for g, m in view["groups"].items()]
    return lines


def test_reference_ansible_is_installed():
    require_ansible()


def test_corpus_has_at_least_40_entries():
    assert len(ENTRIES) >= 40, ENTRIES


@pytest.mark.parametrize("entry", ENTRIES)
def test_corpus_names_match_ansible(entry, runs):
    """bad_* entries are the ones Ansible refuses, and only those."""
    require_ansible()
    ans = runs.get("ansible", entry)
    assert "Traceback" not in ans.stderr, ans.describe()
    if entry.startswith("bad_"):
        assert ans.rc != 0, "Ansible accepts this bad_ entry:\n" + ans.describe()
    else:
        assert ans.rc == 0, "Ansible refuses this entry:\n" + ans.describe()


@pytest.mark.parametrize("entry", ENTRIES)
def test_reads_like_ansible(entry, runs):
    require_ansible()
    ans, ours = runs.get("ansible", entry), runs.get("nodeprep", entry)
    assert "Traceback" not in ours.stderr, ours.describe()
    if ans.rc != 0:
        assert ours.rc == 2, (
            "Ansible refuses this inventory; nodeprep must too (exit code 2)\n"
            f"Ansible said:\n{ans.stderr.strip()}\n\nnodeprep:\n{ours.describe()}"
        )
        return
    try:
        theirs_view = ansible_view(ansible_json(ans.stdout), entry_base(entry))
    except (ValueError, KeyError) as e:
        pytest.fail(f"unreadable ansible-inventory output ({e}):\n{ans.describe()}")
    unsafe = unsafe_fields(theirs_view)
    if unsafe:
        # nodeprep refuses on purpose what ssh, pdsh or a shell would misread (inventory.fields):
        # one line naming one of those values; the parse is still compared, unchecked
        assert ours.rc == 2 and len(ours.stderr.strip().splitlines()) == 1, ours.describe()
        assert any(repr(value)[:40] in ours.stderr for value in unsafe), (unsafe, ours.describe())
        inv = load(str(CORPUS / entry), root=ROOT, check_fields=False)
        ours_view = nodeprep_view(InventoryView(inv).as_dict())
    else:
        assert ours.rc == 0, (
            "Ansible reads this inventory; nodeprep refuses it:\n" + ours.describe()
        )
        try:
            ours_view = nodeprep_view(json.loads(ours.stdout))
        except (ValueError, KeyError, TypeError) as e:
            pytest.fail(f"nodeprep's JSON does not follow the contract ({e}):\n{ours.describe()}")
    if ours_view != theirs_view:
        diff = difflib.unified_diff(
            render(theirs_view), render(ours_view), "ansible-inventory", "nodeprep", lineterm=""
        )
        pytest.fail(
            f"{entry}: nodeprep reads it differently from Ansible\n" + "\n".join(diff),
            pytrace=False,
        )


GOOD = [e for e in ENTRIES if not e.startswith("bad_")]


@pytest.mark.parametrize("entry", GOOD)
def test_reads_the_json_ansible_inventory_lists(entry, runs, tmp_path):
    """What any Ansible inventory (a cloud plugin's included) becomes for nodeprep:
    `ansible-inventory -i ENTRY --list > hosts.json`. nodeprep reading that JSON must give
    Ansible's own view of ENTRY."""
    require_ansible()
    ans = runs.get("ansible", entry)
    assert ans.rc == 0, ans.describe()
    theirs_view = ansible_view(ansible_json(ans.stdout), tmp_path)
    listed = tmp_path / "hosts.json"
    listed.write_text(ans.stdout)
    inv = load(str(listed), root=ROOT, check_fields=not unsafe_fields(theirs_view))
    ours_view = nodeprep_view(InventoryView(inv).as_dict())
    if ours_view != theirs_view:
        diff = difflib.unified_diff(
            render(theirs_view),
            render(ours_view),
            "ansible-inventory",
            "nodeprep (its --list JSON)",
            lineterm="",
        )
        pytest.fail(
            f"{entry}: nodeprep reads Ansible's --list JSON differently\n" + "\n".join(diff),
            pytrace=False,
        )
