"""Every hostfile dialect, nodefiles, Slurm lists, ssh config and Ansible host keys: the
hosts, their order and slots (unit: files written here, no node contacted)."""

from pathlib import Path

import pytest

from nodeprep.errors import InputError
from nodeprep.inventory import addresses
from nodeprep.inventory import model as inventory
from nodeprep.inventory.schema import load_schema
from nodeprep.inventory.sources import Source
from nodeprep.inventory.sshconfig import read_sshconfig

SCHEMA = load_schema([Path(__file__).parent / "data"])


@pytest.fixture(autouse=True)
def _here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # messages show paths relative to the working dir


def load(tmp_path, text, name="hosts", prefix=""):
    path = tmp_path / name
    path.write_text(text)
    inv = inventory.load(prefix + str(path), schema=SCHEMA)
    return [(h.name, h.slots, h.vars.get("cpu_slots"), h.user, h.port) for h in inv.hosts], inv


@pytest.mark.parametrize(
    "text, expected, kind",
    [
        # DeepSpeed
        (
            "worker-1 slots=8\nworker-0 slots=4\n",
            [("worker-1", 8, None, None, 22), ("worker-0", 4, None, None, 22)],
            "hostfile",
        ),
        # Open MPI / PRRTE: max_slots, no slots, comments, count=/cpu= spellings, user@host
        (
            "# the cluster\nnode01 slots=2 max_slots=4\nnode02   # no slots: the GPU count\n"
            "node03 max-slots=8\nnode04 count=6\nbob@node05 cpu=2 port=2222\n",
            [
                ("node01", 2, None, None, 22),
                ("node02", None, None, None, 22),
                ("node03", None, None, None, 22),
                ("node04", 6, None, None, 22),
                ("node05", 2, None, "bob", 2222),
            ],
            "hostfile",
        ),
    ],
)
def test_hostfile_dialects(tmp_path, text, expected, kind):
    got, inv = load(tmp_path, text)
    assert got == expected and inv.kind == kind


def test_mpich_machinefile_as_a_plain_path(tmp_path):
    """HOST:N lines are an MPICH/Hydra machinefile, N processes each, as mpiexec reads them
    (a name with ':' is never a host); Ansible's port reading needs ini: or an .ini file."""
    text = "n1:4\nn2:2\nn3\n"
    got, inv = load(tmp_path, text)
    assert got == [
        ("n1", 4, None, None, 22),
        ("n2", 2, None, None, 22),
        ("n3", None, None, None, 22),
    ]
    assert inv.kind == "hostfile"
    got, _ = load(tmp_path, text, prefix="hostfile:")
    assert got == [
        ("n1", 4, None, None, 22),
        ("n2", 2, None, None, 22),
        ("n3", None, None, None, 22),
    ]
    got, inv = load(tmp_path, text, prefix="ini:")  # the Ansible reading: ports
    assert [(n, p) for n, _, _, _, p in got] == [("n1", 4), ("n2", 2), ("n3", 22)]


def test_pbs_nodefile_repeats_are_cpu_slots(tmp_path):
    got, inv = load(tmp_path, "gpu02\ngpu01\ngpu02\ngpu02\n")
    assert got == [("gpu02", None, 3, None, 22), ("gpu01", None, 1, None, 22)]
    assert inv.kind == "nodefile"
    got, _ = load(tmp_path, "gpu02\ngpu01\ngpu02\n", prefix="pbs:")
    assert got[0][:3] == ("gpu02", None, 2)


@pytest.mark.parametrize(
    "text, message",
    [
        ("n1 slots=2\nn1 slots=2\n", r"^hosts:2: host 'n1' is listed twice"),
        ("n1 slots=x\n", r"^hosts:1: variable 'slots': expected a whole number"),
        ("n1 slots=0\n", r"^hosts:1: variable 'slots': slots must be 1"),
        ("# nothing\n\n", r"^hosts: no hosts in the file"),
        ("all:\n  hosts:\n    a: [\n", r"^hosts:\d+: invalid YAML"),
    ],
)
def test_bad_hostfiles_name_the_line(tmp_path, text, message):
    with pytest.raises(InputError, match=message) as err:
        load(tmp_path, text)
    assert err.value.exit_code == 2


def test_plain_file_with_ini_markers_is_ansible_ini(tmp_path):
    got, inv = load(tmp_path, "[gpus]\nnode[1:2] ansible_user=ops slots=4\n")
    assert inv.kind == "ansible-ini"
    assert got == [("node1", 4, None, "ops", 22), ("node2", 4, None, "ops", 22)]
    got, inv = load(tmp_path, "node1 ansible_port=2200\n")  # no section, Ansible variable
    assert inv.kind == "ansible-ini" and got == [("node1", None, None, None, 2200)]


@pytest.mark.parametrize(
    "nodelist, names",
    [
        ("gpu[01-02,05],cpu1", ["gpu01", "gpu02", "gpu05", "cpu1"]),
        ("rack[1-2]-node[01-02]", ["rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"]),
        ("a[1-2]-ib,b[3,5]", ["a1-ib", "a2-ib", "b3", "b5"]),
    ],
)
def test_slurm_node_lists_with_several_brackets(nodelist, names):
    assert [h.name for h in inventory.load(f"slurm:{nodelist}", schema=SCHEMA).hosts] == names


@pytest.mark.parametrize(
    "key, names, port",
    [
        ("badwolf.example.com:5309", ["badwolf.example.com"], 5309),
        ("192.0.2.[3:5]:23", ["192.0.2.3", "192.0.2.4", "192.0.2.5"], 23),
        ("[2001:db8::1]:2222", ["2001:db8::1"], 2222),
        ("2001:db8::1", ["2001:db8::1"], None),
        (
            "www[01:05:2].example.com",
            ["www01.example.com", "www03.example.com", "www05.example.com"],
            None,
        ),
        ("db-[a:c]", ["db-a", "db-b", "db-c"], None),
        ("n[1:2]x[a:b]", ["n1xa", "n1xb", "n2xa", "n2xb"], None),
        ("web[:2]", ["web0", "web1", "web2"], None),
        ("my_host:22", ["my_host"], 22),
        ("bad_:22", ["bad_:22"], None),  # no valid name: taken whole, as Ansible does
        ("web[3:1]", [], None),  # backwards: no host (the reader warns)
    ],
)
def test_ansible_host_keys(key, names, port):
    assert addresses.host_pattern(key) == (names, port)


@pytest.mark.parametrize(
    "key, why",
    [
        ("web[01:5]", "same width"),
        ("web[1:]", "no end"),
        ("web[1:3:0]", "step"),
        ("web[1:3", "without"),
    ],
)
def test_ansible_ranges_refused(key, why):
    with pytest.raises(addresses.RangeError, match=why):
        addresses.expand(key)


def test_ssh_config_host_entries_become_nodes(tmp_path):
    config = tmp_path / "config"
    config.write_text(
        "Host gpu1 gpu2\n  HostName 10.0.0.%h\n  User ops\n"
        "Host gpu1\n  Port 2201\n"
        "Host login\n  HostName login.example.com\n  ProxyJump bastion\n"
        "Host *.internal !skip\n  User nobody\n"
        "Host *\n  IdentityFile ~/.ssh/id_cluster\n"
    )
    src = Source("sshconfig:", None, tmp_path)
    read_sshconfig(src, None, SCHEMA, path=config)
    assert list(src.hosts) == ["gpu1", "gpu2", "login"]
    gpu1 = {k: v[0] for k, v in src.entry_vars["gpu1"].items()}
    assert gpu1["address"] == "10.0.0.gpu1" and gpu1["port"] == 2201 and gpu1["user"] == "ops"
    assert gpu1["key"].endswith("/.ssh/id_cluster")
    assert src.entry_vars["login"]["proxyjump"][0] == "bastion"
    src = Source("sshconfig:gpu*", None, tmp_path)
    read_sshconfig(src, "gpu*", SCHEMA, path=config)
    assert list(src.hosts) == ["gpu1", "gpu2"]
    with pytest.raises(InputError, match="no Host entry matches 'cpu"):
        read_sshconfig(Source("x", None, tmp_path), "cpu*", SCHEMA, path=config)


@pytest.mark.parametrize(
    "name, data, message",
    [
        ("hosts.ini", b"[g]\na\x00b\n", r"^hosts.ini:2: control character #x00"),
        ("hosts.yml", b"all:\n  hosts:\n    a\x1bb:\n", r"^hosts.yml:3: control character #x1b"),
        ("hostfile", b"n1 slots=2\nn2\x07 slots=2\n", r"^hostfile:2: control character #x07"),
    ],
)
def test_control_characters_are_refused_with_their_line(tmp_path, name, data, message):
    (tmp_path / name).write_bytes(data)
    with pytest.raises(InputError, match=message):
        inventory.load(str(tmp_path / name), schema=SCHEMA)


def test_crlf_line_ends_are_fine(tmp_path):
    got, _ = load(tmp_path, "n1 slots=2\r\nn2 slots=3\r\n")
    assert got == [("n1", 2, None, None, 22), ("n2", 3, None, None, 22)]
