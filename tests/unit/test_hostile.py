"""Hostile values: every one is refused when the inventory is read (exit 2, one line naming where)
or reaches its consumers literally, and none ever runs a command.

The corpus (HOSTILE) goes into every host field and every variable that reaches a node or the
controller's ssh config, one at a time, through `commands.provision.validated` (the inventory
read and every role's validate, exactly what provision does before touching a node). Accepted
values are then fed to the consumers offline: the env file (sourced by sh, bash and, where
installed, zsh), ~/.deepspeed_env as DeepSpeed 0.19.8's pdsh runner turns it into `export K=V;`
for the remote shell (ops/launchenv/dsenv.py cites the lines), and the ssh config block as OpenSSH
resolves it (`ssh -G`). The lab test tests/integration/test_hostile.py provisions and trains with
the accepted values on real nodes and checks the canary files there.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from nodeprep.commands.options import ProvisionOptions
from nodeprep.commands.provision import validated
from nodeprep.engine.events import Events
from nodeprep.errors import NodeprepError
from nodeprep.inventory import fields
from nodeprep.inventory.model import Host
from nodeprep.ops.launchenv import dsenv
from nodeprep.ops.provision import roles as rolemod
from nodeprep.settings import Settings, find_project

ROOT = find_project()
CANARY = "/tmp/nodeprep-canary-unit"

HOSTILE = {
    "subst": f"$(touch {CANARY})",
    "backtick": f"`touch {CANARY}`",
    "semicolon": f"x; touch {CANARY}",
    "and": f"x && touch {CANARY}",
    "pipe": f"x | touch {CANARY}",
    "background": f"x & touch {CANARY}",
    "redirect": f"x > {CANARY}",
    "newline": f"x\ntouch {CANARY}",
    "cr": f"x\rtouch {CANARY}",
    "nul": f"x\0touch {CANARY}",
    "escape": "x\x1b[2Jy",
    "single": f"x'; touch {CANARY}; '",
    "double": f'x"; touch {CANARY}; "',
    "dash": f"-oProxyCommand=touch {CANARY}",
    "percent": "%h%p%r%n%d%u%C%%",
    "long": "a" * 5000,
    "nonascii": "wörker-ñ-日本",
    "space": "a b",
    "glob": "*",
    "param": "${HOME}x",
    "tilde": "~root/x",
    "hash": "x #comment",
    "backslash": "x\\ny",
    "tab": "x\ty",
    "equals": "A=B",
    "empty": "",
}

# where each target goes: a host field (set on worker-1's entry) or a variable (--set-like, in
# the inventory's vars), with the dict wrapping for the env mappings
HOST_FIELDS = ("name", "address", "user", "port", "key")
VARIABLES = (
    "deepspeed_env",
    "deepspeed_env_key",
    "nccl_env",
    "nccl_home",
    "aws_ofi_nccl_home",
    "libfabric_home",
    "venv_path",
    "env_file",
    "login_shell",
    "python",
    "wheelhouse_dir",
    "torch_version",
    "torch_index",
    "controller_key",
    "controller_ssh_config",
    "ssh_alias_prefix",
    "venv_bootstrap",
    "python_requirements",
)
TARGETS = HOST_FIELDS + VARIABLES


def _inventory(target: str, value: str, tmp: Path) -> Path:
    hosts = {"worker-0": {"address": "10.77.0.10"}, "worker-1": {"address": "10.77.0.11"}}
    wide: dict = {
        "controller_ssh_config": str(tmp / "ssh_config"),
        "controller_key": str(tmp / "id"),
        "torch_version": None,
    }
    if target == "name":
        hosts[value] = hosts.pop("worker-1")
    elif target in HOST_FIELDS:
        hosts["worker-1"][target] = value
    elif target == "deepspeed_env":
        wide["deepspeed_env"] = {"HOSTILE": value}
    elif target == "deepspeed_env_key":
        wide["deepspeed_env"] = {value: "1"}
    elif target == "nccl_env":
        wide["nccl_env"] = {"NCCL_HOSTILE": value}
    elif target == "python_requirements":
        wide["python_requirements"] = [value]
    else:
        wide[target] = value
    if wide["torch_version"] is None:
        del wide["torch_version"]
    path = tmp / "hosts.yml"
    # allow_unicode: the file holds the characters themselves; yaml escapes control ones
    path.write_text(yaml.safe_dump({"vars": wide, "hosts": hosts}, allow_unicode=True), "utf-8")
    return path


def _validate(path: Path):
    settings = Settings(state_dir=str(path.parent / "state"))
    return validated(ProvisionOptions(inventory=str(path)), settings, Events())


@pytest.fixture(autouse=True, scope="module")
def _no_canary():
    Path(CANARY).unlink(missing_ok=True)
    yield
    assert not os.path.exists(CANARY), "a hostile value ran a command"


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_value_is_refused_in_one_line_or_taken_literally(target, case, tmp_path):
    value = HOSTILE[case]
    try:
        _roles, prov = _validate(_inventory(target, value, tmp_path))
    except NodeprepError as err:
        text = str(err)
        assert err.exit_code == 2, text
        assert "\n" not in text and "\r" not in text and "\0" not in text and "\x1b" not in text
        assert "Traceback" not in text
        # it names where: the inventory file, or the host
        assert "hosts.yml" in text or "worker" in text or "ssh_config" in text, text
        return
    # accepted: the value is in the inventory exactly as written
    if target == "name":
        assert value in [h.name for h in prov.inventory.hosts]
    elif target in HOST_FIELDS:
        host = prov.inventory.host("worker-1")
        got = getattr(host, target)
        if target == "key" and value == "":
            assert got is None  # an empty key is no key: ssh's default keys
        else:
            assert str(got) == value or (target == "key" and got.endswith(value))
    else:
        wrapped = {
            "deepspeed_env": {"HOSTILE": value},
            "deepspeed_env_key": {value: "1"},
            "nccl_env": {"NCCL_HOSTILE": value},
            "python_requirements": [value],
        }
        assert prov.inventory.var("worker-1", target) == wrapped.get(target, value)
    _consumers_take_it_literally(target, value, prov, tmp_path)


def _consumers_take_it_literally(target, value, prov, tmp):
    if target in ("deepspeed_env", "nccl_env"):
        key = "HOSTILE" if target == "deepspeed_env" else "NCCL_HOSTILE"
        assert _through_deepspeed_pdsh({key: value}, tmp) == {key: value.strip()}
        if target == "nccl_env":
            assert _sourced(_role("nccl").env_block({key: value}), key, tmp) == value
    if target in ("address", "user", "key", "name", "controller_key"):
        _ssh_config_reads_it(prov, tmp)


def _role(name):
    return rolemod.load(name, ROOT / "roles")[0].module


def _shells():
    return [sh for sh in ("sh", "bash", "zsh") if shutil.which(sh)]


def _sourced(block: str, key: str, tmp: Path) -> str:
    """What every POSIX shell gets for KEY after sourcing BLOCK (all must agree)."""
    env_file = tmp / "env.sh"
    env_file.write_text(block, "utf-8")
    got = set()
    for sh in _shells():
        r = subprocess.run(
            [sh, "-c", f'. "$1"; printf %s "${key}"', sh, str(env_file)],
            capture_output=True,
            timeout=30,
            env={"PATH": os.environ["PATH"]},
        )
        assert r.returncode == 0, r.stderr
        got.add(r.stdout.decode("utf-8"))
    assert len(got) == 1, got
    return got.pop()


def _pdsh_export(key: str, val: str) -> str:
    """DeepSpeed 0.19.8 multinode_runner.py:37-41 add_export, :102-104 the pdsh export."""
    val = val.strip()
    if re.search(r"[^\w@%+=:,./-]", val):
        val = f'"{val}"'
    return f"export {key.strip()}={val}; "


def _through_deepspeed_pdsh(env: dict, tmp: Path) -> dict:
    """ENV written as the deepspeed_env role writes ~/.deepspeed_env, read back as DeepSpeed
    reads it, exported as its pdsh runner exports it, and printed by the remote shell."""
    text = _role("deepspeed_env").content(env)
    parsed = dsenv.parse(text, "~/.deepspeed_env")
    command = "".join(_pdsh_export(k, v) for k, v in parsed.entries.items())
    out = {}
    for key in parsed.entries:
        r = subprocess.run(
            ["sh", "-c", command + f'printf %s "${key}"'],
            capture_output=True,
            timeout=30,
            env={"PATH": os.environ["PATH"]},
        )
        assert r.returncode == 0, r.stderr
        out[key] = r.stdout.decode("utf-8")
    return out


def _ssh_g(config: Path, alias: str) -> dict:
    """What OpenSSH itself resolves for ALIAS from CONFIG (`ssh -G`, no connection)."""
    r = subprocess.run(
        ["ssh", "-F", str(config), "-G", alias],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    return dict(line.split(" ", 1) for line in r.stdout.splitlines() if " " in line)


def _ssh_config_reads_it(prov, tmp):
    role = _role("ssh_config")
    hosts = prov.inventory.hosts
    key = str(tmp / "id %h x")
    config = tmp / "ssh_config_written"
    config.write_text(role.entries(hosts, key), "utf-8")
    for h in hosts:
        got = _ssh_g(config, h.name)
        assert got["hostname"] == h.address
        assert int(got["port"]) == h.port
        assert got["user"] == (h.user or got["user"])
        # ssh -G shows IdentityFile before its %-expansion, where %% becomes one '%'
        assert got["identityfile"].replace("%%", "%") == key


@pytest.mark.parametrize(
    "name",
    [
        "worker-1",
        "gpu01.example.com",
        "node_1",
        "10.0.0.5",
        "2001:db8::1",
        "::1",
        "a.b.c.",
        "x" * 63,
        "1node",
    ],
)
def test_plain_names_are_accepted(name):
    assert fields.name_problem(name) is None


@pytest.mark.parametrize(
    "name",
    [
        "-x",
        "a b",
        "a;b",
        "a/b",
        "a$b",
        "a%h",
        "a..b",
        "x" * 64,
        "wörker",
        "a\nb",
        "",
        ".",
        "a:b",
        "fe80::1%eth0",
        "[::1]",
    ],
)
def test_unsafe_names_are_refused(name):
    assert fields.name_problem(name)


@pytest.mark.parametrize(
    "address,ok",
    [
        ("fe80::1%eth0", True),
        ("10.0.0.1%eth0", False),
        ("fe80::1%e;x", False),
        ("host.example.com", True),
        ("10.0.0.1 -oProxyCommand=x", False),
    ],
)
def test_addresses(address, ok):
    assert (fields.address_problem(address) is None) is ok


@pytest.mark.parametrize(
    "user,ok",
    [
        ("nodeprep", True),
        ("jdoe@corp.example.com", True),
        ("john.doe", True),
        ("-oX", False),
        ("a b", False),
        ("a;b", False),
        ("$(x)", False),
        ("a@", False),
    ],
)
def test_users(user, ok):
    assert (fields.user_problem(user) is None) is ok


def test_ipv6_zone_survives_the_ssh_config(tmp_path):
    host = Host(
        "w1", "fe80::1%eth0", 22, user="u", key=None, groups=(), vars={}, origin={}, slots=None
    )
    text = _role("ssh_config").entries([host], None)
    assert "HostName fe80::1%%eth0" in text
    (tmp_path / "c").write_text(text)
    assert _ssh_g(tmp_path / "c", "w1")["hostname"] == "fe80::1%eth0"


def test_the_corpus_covers_the_cases_the_issue_names():
    joined = "".join(HOSTILE.values())
    for needle in ("$(", "`", ";", "&&", "|", "\n", "\0", "'", '"', "%h"):
        assert needle in joined
    assert any(v.startswith("-") for v in HOSTILE.values())
    assert any(len(v) > 4096 for v in HOSTILE.values())
    assert any(not v.isascii() for v in HOSTILE.values())
