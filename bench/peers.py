"""Peers for bench/provision_bench.py: the end state `invoke provision` leaves on the lab
(read back from the node homes on the host file system), written out as an Ansible playbook
and a pyinfra deploy that manage the same files, and the venvs those tools run from.

Everything generated goes under .nodeprep/bench-provision/ (git-ignored, 0700: it holds a
copy of the cluster's private key)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from lib import ROOT

VENVS = ROOT / ".nodeprep" / "bench-venvs"
OUT = ROOT / ".nodeprep" / "bench-provision"
# ansible-core 2.20+ needs Python >= 3.12 (we have 3.11); pyinfra 3.10 pins paramiko < 5,
# which is why it gets a venv of its own, apart from the project's Fabric/paramiko 5.
PINS = {"ansible": "ansible-core>=2.19,<2.20", "pyinfra": "pyinfra>=3.10,<3.11"}
NON_POSIX = ("csh", "tcsh", "fish")  # roles/shell: any other login shell is kept

# (path under the home, block name, mode or None = kept, where) as the roles write them
BLOCKS = [
    (".ssh/authorized_keys", "ssh_keys", 0o600, "bottom"),
    (".ssh/known_hosts", "cluster hosts", None, "bottom"),
    (".ssh/config", "hosts", 0o600, "bottom"),
    (".bashrc", "env", None, "top"),
    (".nodeprep/env.sh", "nccl", 0o600, "bottom"),
]
FILES = [
    (".ssh/nodeprep_cluster_ed25519", 0o600),
    (".ssh/nodeprep_cluster_ed25519.pub", 0o644),
    (".deepspeed_env", 0o600),
]


def venv(tool: str) -> Path:
    """bin/ of the tool's own venv, made (pip install from the registry) when missing."""
    d = VENVS / tool
    exe = d / "bin" / ("ansible-playbook" if tool == "ansible" else "pyinfra")
    if not exe.exists():
        print(f"bench: creating {d.relative_to(ROOT)} ({PINS[tool]})", flush=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(d)], check=True)
        subprocess.run(
            [str(d / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", PINS[tool]],
            check=True,
            stderr=subprocess.DEVNULL,
        )
    return d / "bin"


def version(tool: str) -> str:
    py = VENVS / tool / "bin" / "python"
    pkg = "ansible-core" if tool == "ansible" else "pyinfra"
    return subprocess.run(
        [str(py), "-c", f"import importlib.metadata as m; print(m.version({pkg!r}))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def markers(name: str) -> tuple[str, str]:  # as nodeprep.engine.steps writes them
    return (
        f"BEGIN nodeprep {name} (managed: edits inside this block are replaced)",
        f"END nodeprep {name}",
    )


def block_body(text: str, name: str) -> str:
    begin, end = markers(name)
    lines = text.splitlines()
    i, j = lines.index("# " + begin), lines.index("# " + end)
    return "\n".join(lines[i + 1 : j])


def mode_of(p: Path) -> int:
    return p.stat().st_mode & 0o777


def end_state(info, controller_config: Path) -> dict:
    """What nodeprep wrote, from node 0's home; every other node must hold the same (else a
    single playbook could not be a no-op everywhere). Also checks the modes the roles set."""
    homes = [n.home for n in info.nodes]
    state = {"blocks": [], "files": []}
    for rel, name, mode, where in BLOCKS:
        bodies = {block_body((h / rel).read_text(), name) for h in homes}
        assert len(bodies) == 1, f"{rel} [{name}] differs between nodes"
        if mode is not None:
            assert all(mode_of(h / rel) == mode for h in homes), f"{rel} mode is not {mode:o}"
        state["blocks"].append(
            {"rel": rel, "name": name, "mode": mode, "where": where, "body": bodies.pop()}
        )
    for rel, mode in FILES:
        contents = {(h / rel).read_bytes() for h in homes}
        assert len(contents) == 1, f"{rel} differs between nodes"
        assert all(mode_of(h / rel) == mode for h in homes), f"{rel} mode is not {mode:o}"
        local = OUT / "files" / rel.replace("/", "_").lstrip(".")
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(contents.pop())
        os.chmod(local, 0o600)
        state["files"].append({"rel": rel, "mode": mode, "src": str(local)})
    text = controller_config.read_text()
    name = re.search(r"^# BEGIN nodeprep (hosts \S+) \(managed", text, re.M).group(1)
    state["controller_block"] = {
        "path": str(controller_config),
        "name": name,
        "body": block_body(text, name),
    }
    return state


def _j(v) -> str:  # a JSON string is a valid YAML scalar
    return json.dumps(v)


def write_ansible(
    info, known_hosts: Path, state: dict, local_files: list[Path]
) -> tuple[Path, Path]:
    """ansible.cfg (ControlPersist, pipelining, forks = nodes, pinned host keys), inventory
    and playbook. Returns (config, playbook)."""
    d = OUT / "ansible"
    (d / "cp").mkdir(parents=True, exist_ok=True)
    home = "/home/" + info.user
    ssh_args = (
        "-o ControlMaster=auto -o ControlPersist=60s "
        f"-o UserKnownHostsFile={known_hosts} -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes"
    )
    (d / "ansible.cfg").write_text(f"""[defaults]
inventory = {d / "hosts.ini"}
forks = {len(info.nodes)}
gathering = explicit
host_key_checking = True
retry_files_enabled = False
interpreter_python = /usr/bin/python3
local_tmp = {d / "tmp"}

[ssh_connection]
pipelining = True
control_path_dir = {d / "cp"}
ssh_args = {ssh_args}
""")
    hosts = ["[nodes]"] + [
        f"{n.name} ansible_host={n.address} ansible_port={n.port}" for n in info.nodes
    ]
    hosts += [
        "",
        "[nodes:vars]",
        f"ansible_user={info.user}",
        f"ansible_ssh_private_key_file={info.key}",
        "",
    ]
    (d / "hosts.ini").write_text("\n".join(hosts))

    def blockinfile(path, name, body, mode, where, indent="      "):
        b, e = markers(name)
        t = [
            f"{indent[:-2]}- name: {_j(f'block {name} in {path}')}",
            f"{indent}ansible.builtin.blockinfile:",
            f"{indent}  path: {_j(path)}",
            f"{indent}  marker: '# {{mark}}'",
            f"{indent}  marker_begin: {_j(b)}",
            f"{indent}  marker_end: {_j(e)}",
            f"{indent}  block: {_j(body)}",
            f"{indent}  create: true",
        ]
        if mode is not None:
            t.append(f"{indent}  mode: '0{mode:o}'")
        if where == "top":
            t.append(f"{indent}  insertbefore: BOF")
        return t

    cb = state["controller_block"]
    y = [
        "- name: controller, keys exist with 0600 and the ssh config block",
        "  hosts: localhost",
        "  connection: local",
        "  gather_facts: false",
        "  vars: {ansible_python_interpreter: '{{ ansible_playbook_python }}'}",
        "  tasks:",
    ]
    for f in local_files:
        y += [
            f"    - name: {_j(f'key {f}')}",
            "      ansible.builtin.file:",
            f"        path: {_j(str(f))}",
            "        state: file",
            "        mode: '0600'",
        ]
    y += blockinfile(cb["path"], cb["name"], cb["body"], 0o600, "bottom")
    y += [
        "",
        "- name: nodes",
        "  hosts: nodes",
        "  gather_facts: false",
        "  tasks:",
        "    - name: login shell, check only (changing it needs root)",
        f"      ansible.builtin.command: getent passwd {info.user}",
        "      register: pw",
        "      changed_when: false",
        "    - name: login shell is POSIX",
        "      ansible.builtin.assert:",
        f"        that: \"(pw.stdout.split(':')[6] | basename) not in {list(NON_POSIX)}\"",
        "        quiet: true",
    ]
    for b in state["blocks"]:
        y += blockinfile(f"{home}/{b['rel']}", b["name"], b["body"], b["mode"], b["where"])
    for f in state["files"]:
        y += [
            f"    - name: {_j('file ' + f['rel'])}",
            "      ansible.builtin.copy:",
            f"        src: {_j(f['src'])}",
            f"        dest: {_j(home + '/' + f['rel'])}",
            f"        mode: '0{f['mode']:o}'",
        ]
    (d / "site.yml").write_text("\n".join(y) + "\n")
    return d / "ansible.cfg", d / "site.yml"


def write_pyinfra(
    info, known_hosts: Path, state: dict, local_files: list[Path]
) -> tuple[Path, Path]:
    """inventory.py (the nodes, plus @local for the controller's files, as nodeprep does
    those on the controller) and deploy.py. Returns (inventory, deploy)."""
    d = OUT / "pyinfra"
    d.mkdir(parents=True, exist_ok=True)
    data = {
        "ssh_user": info.user,
        "ssh_key": str(info.key),
        "ssh_known_hosts_file": str(known_hosts),
        "ssh_strict_host_key_checking": "yes",
    }
    nodes = [(n.name, dict(data, ssh_hostname=n.address, ssh_port=n.port)) for n in info.nodes]
    (d / "inventory.py").write_text(f"nodes = {nodes!r}\ncontroller = ['@local']\n")
    home = "/home/" + info.user
    blocks = [dict(b, path=f"{home}/{b['rel']}") for b in state["blocks"]]
    files = [dict(f, path=f"{home}/{f['rel']}") for f in state["files"]]
    (d / "deploy.py").write_text(f'''"""generated by bench/peers.py"""
import os
import shlex
from io import StringIO

from pyinfra import host
from pyinfra.api import FactBase
from pyinfra.facts.server import Command
from pyinfra.operations import files

BLOCKS = {blocks!r}
FILES = {files!r}
CONTROLLER = {state["controller_block"]!r}
KEYS = {[str(f) for f in local_files]!r}
NON_POSIX = {NON_POSIX!r}
MISSING = "@@pyinfra-bench-missing@@"


class Text(FactBase):
    """The file's lines (None if it does not exist). pyinfra's own Block fact cannot be used:
    it puts the marker unescaped into an awk regex, and nodeprep's markers hold parentheses
    (and a path with / for the controller block), so it never finds them and appends a
    second block."""

    def command(self, path):
        return f"if [ -f {{shlex.quote(path)}} ]; then cat {{shlex.quote(path)}}; else echo {{MISSING}}; fi"

    def process(self, output):
        return None if list(output) == [MISSING] else list(output)


def with_block(lines, begin, end, body, where):
    want = [begin, *body.split("\\n"), end]
    if begin in lines and end in lines[lines.index(begin):]:
        i = lines.index(begin)
        j = lines.index(end, i)
        return lines[:i] + want + lines[j + 1:]
    return want + lines if where == "top" else lines + want


def block(path, name, body, mode, where):
    begin = "# BEGIN nodeprep " + name + " (managed: edits inside this block are replaced)"
    end = "# END nodeprep " + name
    lines = host.get_fact(Text, path=path)
    new = with_block(lines or [], begin, end, body, where)
    if new != lines:  # only then: a put of the whole new text (mode kept unless given)
        files.put(name=f"block {{name}} in {{path}}", src=StringIO("\\n".join(new) + "\\n"),
                  dest=path, mode=f"{{mode:o}}" if mode is not None else None)
    elif mode is not None:
        files.file(name=f"mode of {{path}}", path=path, mode=f"{{mode:o}}")


if host.name == "@local":
    for k in KEYS:
        files.file(name=f"key {{k}}", path=k, mode="600")
    c = CONTROLLER
    block(c["path"], c["name"], c["body"], 0o600, "bottom")
else:
    # login shell: check only (changing it needs root), one round trip like nodeprep's fact
    shell = host.get_fact(Command, "getent passwd {info.user}").split(":")[6]
    assert os.path.basename(shell) not in NON_POSIX, f"{{host.name}}: login shell {{shell}}"
    for b in BLOCKS:
        block(b["path"], b["name"], b["body"], b["mode"], b["where"])
    for f in FILES:
        files.put(name=f"file {{f['rel']}}", src=f["src"], dest=f["path"], mode=f"{{f['mode']:o}}")
''')  # noqa: E501 (the generated deploy.py, kept as written)
    return d / "inventory.py", d / "deploy.py"


def prepare_out() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    os.chmod(OUT, 0o700)


def pyinfra_noop(n_hosts: int):
    # pyinfra 3 ends with a "Results" table (Operation, Hosts, Success, Error, No Change) and
    # a "Grand total" row; Success counts operations that ran (changed something).
    def check(output, quiet=False):
        text = re.sub(r"\x1b\[[0-9;]*m", "", output)
        total = re.search(r"^\s*Grand total\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)", text, re.M)
        connected = len(set(re.findall(r"^\s*\[([^\]]+)\]\s+Connected", text, re.M)))
        num = [0 if x == "-" else int(x) for x in total.groups()] if total else None
        if quiet:
            return (
                f"{num[1]} changed, {num[3]} unchanged operations over {connected} hosts"
                if num
                else "no Results table"
            )
        if not num or num[1] or num[2] or not num[3] or connected != n_hosts:
            raise SystemExit(f"bench: pyinfra run was not a no-op:\n{text[-3000:]}")

    return check
