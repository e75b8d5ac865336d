from pathlib import Path

import pytest

from nodeprep.errors import InputError
from nodeprep.inventory import model as inventory
from nodeprep.inventory.schema import load_schema
from nodeprep.inventory.yamlfile import load_yaml
from nodeprep.settings import find_project

ROOT = find_project()

DATA = Path(__file__).parent / "data"
CASES = DATA / "inventories"
SCHEMA = load_schema([DATA])  # core variables plus the test role's (tests/unit/data/roles)
BAD = sorted(p.name for p in CASES.iterdir() if (p / "expected.txt").exists())


def load(spec, **kw):
    return inventory.load(str(spec), schema=SCHEMA, **kw)


@pytest.mark.parametrize("case", BAD)
def test_bad_inventory_names_file_and_line(case, monkeypatch):
    """Each case dir holds an inventory and expected.txt: the start of the error message."""
    monkeypatch.chdir(CASES / case)
    spec_file = CASES / case / "spec.txt"
    spec = spec_file.read_text().strip() if spec_file.exists() else "."
    with pytest.raises(InputError) as err:
        load(spec)
    assert str(err.value).startswith((CASES / case / "expected.txt").read_text().strip())
    assert err.value.exit_code == 2


def test_bad_cases_are_found():
    """An empty BAD would parametrize the test above with nothing (pytest skips it)."""
    assert len(BAD) >= 20, f"cases with an expected.txt under {CASES}: {BAD}"


def test_missing_named_inventory(monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(InputError) as err:
        inventory.load("nosuch")
    assert str(err.value) == (
        "inventory 'nosuch' not found: looked for "
        "inventory/nosuch (create it, or use `invoke lab.up` "
        "for the local lab)"
    )


def test_missing_path():
    with pytest.raises(InputError, match="inventory 'no/such.yml' not found"):
        load("no/such.yml")


def test_precedence_and_origins():
    inv = load(CASES / "precedence")
    gpu01, gpu02, gpu03 = (inv.host(n) for n in ("gpu01", "gpu02", "gpu03"))
    assert gpu02.groups == ("gpus", "fast")
    # group vars < group_vars files < host_vars files
    assert gpu01.vars["python"] == "/opt/py/gv-gpus"
    assert gpu02.vars["python"] == "/opt/py/hv-gpu02"
    assert gpu02.origin["python"].endswith("host_vars/gpu02.yml:1")
    # later group wins, and group_vars/<group>/*.yml counts as that group's file
    assert (gpu01.slots, gpu02.slots, gpu03.slots) == (4, 7, None)
    # host entry beats inventory-wide vars; group `all` and group_vars/all.yaml reach everyone
    assert gpu03.vars["python"] == "/opt/py/host-entry"
    assert gpu03.vars["cuda_version"] == "12.0"
    assert gpu03.vars["extra_packages"] == ["htop"]
    # role defaults are not merged in, but var() falls back to them
    assert "ssh_mesh" not in gpu01.vars
    assert inv.var(gpu01, "ssh_mesh", SCHEMA) is False
    assert inv.var("gpu01", "nccl_timeout", SCHEMA) == 10
    with pytest.raises(KeyError):
        inv.var(gpu01, "undeclared", SCHEMA)


def test_relative_key_is_relative_to_inventory_dir():
    host = load(CASES / "precedence").host("gpu03")
    assert host.key == str(CASES / "precedence" / "keys" / "id_test")
    assert host.vars["key"] == "keys/id_test"
    assert (host.address, host.port, host.user) == ("gpu03", 22, None)


def test_extra_vars_win_and_are_checked():
    inv = load(CASES / "precedence", extra_vars={"python": "/cli/python", "port": "2200"})
    for host in inv.hosts:
        assert host.vars["python"] == "/cli/python" and host.origin["python"] == "cli"
        assert host.port == 2200
    with pytest.raises(InputError, match="^extra variable 'ssh_mesh': expected true or false"):
        load(CASES / "precedence", extra_vars={"ssh_mesh": "yes"})
    with pytest.raises(InputError, match="unknown extra variable 'prot' .did you mean 'port'"):
        load(CASES / "precedence", extra_vars={"prot": 1})


def test_explain_lists_every_scope_in_order(monkeypatch):
    monkeypatch.chdir(CASES / "precedence")
    inv = load(".", extra_vars={"python": "/cli"})
    assert inv.explain("gpu02", "python") == [
        ("default", "python3", SCHEMA["python"].source),
        ("inventory", "/opt/py/wide", "hosts.yml:12"),
        ("group gpus", "/opt/py/group-gpus", "hosts.yml:7"),
        ("group fast", "/opt/py/group-fast", "hosts.yml:10"),
        ("group_vars gpus", "/opt/py/gv-gpus", "group_vars/gpus.yml:1"),
        ("host_vars", "/opt/py/hv-gpu02", "host_vars/gpu02.yml:1"),
        ("cli", "/cli", "cli"),
    ]
    assert inv.explain("gpu03", "ssh_mesh") == [("default", False, SCHEMA["ssh_mesh"].source)]
    with pytest.raises(InputError, match="did you mean 'python'"):
        inv.explain("gpu01", "pyhton")
    with pytest.raises(InputError, match="no host 'gpu9'"):
        inv.explain("gpu9", "python")


def test_ansible_layout():
    inv = load(CASES / "ansible")
    assert [h.name for h in inv.hosts] == ["login1", "worker01", "worker02", "worker03", "worker04"]
    assert inv.groups["gpus"] == ["worker01", "worker02", "worker03", "worker04"]
    assert inv.groups["rack1"] == ["worker01", "worker02"]
    assert inv.groups["all"][0] == "login1"
    login, w1, w3 = inv.host("login1"), inv.host("worker01"), inv.host("worker03")
    assert (login.address, login.port, login.user, login.slots) == ("10.0.0.9", 2222, "lab", None)
    assert w1.groups == ("gpus", "rack1") and w1.slots == 8
    assert w1.vars["python"] == "/usr/bin/python3.11"
    assert w3.key == "/keys/rack2" and w3.vars.get("python") is None
    assert "ansible_become" not in str(login.vars)


def test_hostfile_explicit_and_detected():
    path = CASES / "hostfile_ok" / "hostfile"
    for spec in (f"hostfile:{path}", str(path)):
        inv = load(spec)
        assert [(h.name, h.slots) for h in inv.hosts] == [("worker-0", 8), ("worker-1", 4)]
        assert inv.hosts[1].origin["slots"].endswith("hostfile:4")


def test_pbs_nodefile_counts_slots(monkeypatch):
    path = CASES / "pbs_ok" / "nodefile"
    monkeypatch.setenv("PBS_NODEFILE", str(path))
    for spec in ("pbs:", f"pbs:{path}", str(path)):
        inv = load(spec)
        # the repeats count CPU slots: a GPU node still runs one process per GPU
        assert [(h.name, h.slots, h.vars["cpu_slots"]) for h in inv.hosts] == [
            ("gpu02", None, 3),
            ("gpu01", None, 2),
        ]


def test_slurm(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu-[01-02],cpu1")
    assert [h.name for h in load("slurm:").hosts] == ["gpu-01", "gpu-02", "cpu1"]
    assert [h.name for h in load("slurm:n[1-2]-ib").hosts] == ["n1-ib", "n2-ib"]
    assert load("slurm:", extra_vars={"user": "me"}).hosts[0].user == "me"
    with pytest.raises(InputError, match=r"^bad Slurm node list 'gpu\[2-1\]'"):
        load("slurm:gpu[2-1]")
    with pytest.raises(InputError, match="listed twice"):
        load("slurm:gpu1,gpu[1-2]")
    monkeypatch.delenv("SLURM_JOB_NODELIST")
    with pytest.raises(InputError, match=r"needs \$SLURM_JOB_NODELIST"):
        load("slurm:")


def test_pbs_without_nodefile(monkeypatch):
    monkeypatch.delenv("PBS_NODEFILE", raising=False)
    with pytest.raises(InputError, match=r"needs \$PBS_NODEFILE"):
        load("pbs:")


@pytest.fixture
def cluster():
    return load("slurm:login1,gpu[01-04],gpu10,cpu[1-2]", extra_vars={})


@pytest.mark.parametrize(
    "limit, names",
    [
        (None, "login1 gpu01 gpu02 gpu03 gpu04 gpu10 cpu1 cpu2"),
        ("", "login1 gpu01 gpu02 gpu03 gpu04 gpu10 cpu1 cpu2"),
        ("gpu[02-03]", "gpu02 gpu03"),
        ("gpu[01-20]", "gpu01 gpu02 gpu03 gpu04 gpu10"),
        ("cpu*,login1", "login1 cpu1 cpu2"),
        ("gpu0?", "gpu01 gpu02 gpu03 gpu04"),
        ("!gpu*", "login1 cpu1 cpu2"),
        ("gpu*,!gpu[01-02],!gpu10", "gpu03 gpu04"),
        ("all,!cpu[1-2]", "login1 gpu01 gpu02 gpu03 gpu04 gpu10"),
    ],
)
def test_select(cluster, limit, names):
    assert [h.name for h in cluster.select(limit)] == names.split()


def test_select_groups():
    inv = load(CASES / "ansible")
    assert [h.name for h in inv.select("rack2,login1")] == ["login1", "worker03", "worker04"]
    assert [h.name for h in inv.select("gpus,!rack1")] == ["worker03", "worker04"]


@pytest.mark.parametrize(
    "limit, message",
    [
        ("gpu9", "limit 'gpu9' matches no host or group"),
        ("gpus", "did you mean 'gpu10'?"),
        ("tpu*", "limit 'tpu*' matches no host"),
        ("gpu01,!nope", "limit 'nope' matches no host"),
        ("gpu[3-1]", "goes backwards"),
        ("gpu01,!gpu01", "leaves no host"),
    ],
)
def test_select_errors(cluster, limit, message):
    with pytest.raises(InputError) as err:
        cluster.select(limit)
    assert message in str(err.value) and err.value.exit_code == 2


def test_lab_example_uses_every_schema_variable(monkeypatch):
    """The lab example documents the inventory: a role that adds a variable must show it
    there too, so this test fails until inventory/lab sets it somewhere."""
    monkeypatch.chdir(ROOT)
    inv = inventory.load("lab")
    used = {var for host in inv.hosts for var in host.vars}
    missing = sorted(set(load_schema()) - used)
    assert not missing, f"inventory/lab/ sets no value for {missing}"
    assert len(inv.select("gpus")) == 4 and inv.host("login01").vars["cpu_only"] is True


def test_yaml_lines_and_merge_keys(tmp_path):
    path = tmp_path / "x.yml"
    path.write_text(
        "base: &b {port: 22, user: a}\nhosts:\n  - gpu01\n  - gpu02\nnode:\n"
        "  <<: *b\n  port: 2222\n"
    )
    data = load_yaml(path)
    assert data.line_of("hosts") == 2 and data["hosts"].line_of(1) == 4
    # a key overriding a merged one is not a duplicate
    assert data["node"] == {"port": 2222, "user": "a"} and data["node"].line == 6
    with pytest.raises(InputError, match="y.yml: file not found"):
        load_yaml(tmp_path / "y.yml")


def test_ansible_semantics_warn_and_merge_where_ansible_does():
    # An unexpected key in a group is skipped with a warning (Ansible warns too), with a hint.
    inv = load(CASES / "ansible_bad_key")
    assert [h.name for h in inv.hosts] == ["gpu01"]
    assert any(
        "hosts.yml:4: key 'chidren' in group 'all' is skipped" in w
        and "did you mean 'children'?" in w
        for w in inv.warnings
    )
    # A host listed in two groups with variables in both: the later one wins, as in Ansible.
    # A backwards range gives no host, as in Ansible, but never silently.
    inv = load(CASES / "ansible_bad_range")
    assert inv.hosts == [] and inv.groups["gpus"] == []
    assert [w.split("/")[-1] for w in inv.warnings] == [
        "hosts.yml:5: 'gpu[04:01]' expands to no host (the range goes backwards)"
    ]
    inv = load(CASES / "ansible_vars_twice")
    assert inv.host("gpu01").port == 2222 and inv.host("gpu01").groups == ("a", "b")
    assert inv.host("gpu01").origin["port"].endswith("hosts.yml:8")


def test_hosts_nodeprep_cannot_reach_are_named_when_selected(tmp_path, monkeypatch):
    from nodeprep.commands.common import select_hosts
    from nodeprep.settings import Settings

    monkeypatch.chdir(tmp_path)
    (tmp_path / "hosts.ini").write_text(
        "[gpus]\ngpu01 ansible_host=10.0.0.1\n"
        "gpu02 ansible_ssh_common_args='-o ProxyJump=bastion'\n"
        "localhost ansible_connection=local\nwin1 ansible_connection=winrm\n"
        "[gpus:vars]\nadress=10.0.0.9\n"
    )
    logged = []

    class Events:
        def log(self, text):
            logged.append(text)

    settings = Settings(project_root=str(ROOT))
    inv, hosts = select_hosts("hosts.ini", "gpu01", settings, events=Events())
    assert [h.name for h in hosts] == ["gpu01"] and hosts[0].address == "10.0.0.1"
    assert logged == [
        "warning: hosts.ini:7: variable 'adress' is not a nodeprep variable and "
        "is ignored; did you mean 'address'?"
    ]
    assert (
        inv.host("gpu02").jump[0].address == "bastion"
    )  # a jump host is reached (engine/bastions)
    for name, message in (
        (
            "localhost,gpu01",
            r"^hosts.ini:4: host localhost: connection local .* in a run with other nodes",
        ),
        ("win1", r"^hosts.ini:5: host win1: connection 'winrm' is not supported"),
    ):
        with pytest.raises(InputError, match=message) as err:
            select_hosts("hosts.ini", name, settings)
        assert err.value.exit_code == 2 and "--limit" in str(err.value)


def test_a_plugin_config_is_refused_with_the_command_that_reads_it(tmp_path):
    from nodeprep.errors import InputError
    from nodeprep.inventory.model import load

    f = tmp_path / "aws_ec2.yml"
    f.write_text("plugin: amazon.aws.aws_ec2\nregions: [us-east-1]\n")
    with pytest.raises(InputError) as e:
        load(str(f))
    assert e.value.line == 1 and f"ansible-inventory -i {f} --list > hosts.json" in str(
        e.value.hint
    )


def test_an_inventory_script_that_prints_no_json_is_named(tmp_path):
    from nodeprep.errors import InputError
    from nodeprep.inventory.model import load

    f = tmp_path / "inv.sh"
    f.write_text("#!/bin/sh\necho '{not json'\n")
    f.chmod(0o755)
    with pytest.raises(InputError) as e:
        load(str(f))
    assert "--list" in str(e.value.file) and "invalid JSON" in str(e.value)
    f.chmod(0o644)  # not executable: read as a file (and refused as one)
    with pytest.raises(InputError):
        load(str(f))
