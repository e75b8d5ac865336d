"""`invoke init` as data (commands/init.py build, inventory/writer.py): a source's hosts and
the probe's answers (recorded fact cases, tests/facts/) into a commented native hosts.yml that
nodeprep reads back with the same hosts, reach values and groups; hostile values written
literally; the refusals (an existing inventory without --force, a bad name, no --from)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from nodeprep.commands.init import _target, build
from nodeprep.commands.options import InitOptions
from nodeprep.errors import InputError
from nodeprep.inventory import writer
from nodeprep.inventory.model import load
from nodeprep.settings import Settings as NodeprepSettings

FACTS = Path(__file__).resolve().parents[1] / "facts"


def case(fact: str, name: str):
    return json.loads((FACTS / fact / f"{name}.json").read_text())["expected"]


def answered(gpus: str) -> dict:
    return {
        "os": case("os", "debian12"),
        "python": case("python", "system"),
        "gpus": case("gpus", gpus),
        "nic": "eth0",
    }


@pytest.mark.parametrize(
    "value",
    [
        "plain",
        "a: b",
        "#x",
        "yes",
        "1.5",
        "null",
        "-x",
        'q"uote',
        "10.0.0.1",
        "~/k",
        "x y",
        "[1]",
        "{a}",
        "@at",
        "%p",
        22,
        True,
        "2001:db8::1",
        "a:b",
        "ops@bastion:2222,gw",
        "`x`",
        "a,b",
        "!tag",
        "&anchor",
        "*alias",
        "'s'",
        "é",
    ],
)
def test_scalars_read_back_as_written(value):
    assert yaml.safe_load(writer.scalar(value)) == value
    assert (
        yaml.safe_load("{k: " + writer.scalar(value) + "}")["k"] == value
    )  # in a flow mapping too


def test_an_ansible_source_becomes_a_native_inventory_with_its_groups(tmp_path):
    src = tmp_path / "hosts.ini"
    src.write_text(
        "[gpus]\ngpu01 ansible_host=10.0.0.11 ansible_user=ops\ngpu02 ansible_host=10.0.0.12 "
        "ansible_user=ops\n[login]\n"
        "login01 ansible_host=10.0.0.5 ansible_user=ops ansible_port=2222\n"
        "[all:vars]\nansible_ssh_common_args='-o ProxyJump=ops@bastion'\n"
    )
    inv = load(str(src))
    facts = {
        "gpu01": answered("a100_8x"),
        "gpu02": answered("a100_8x"),
        "login01": answered("no_devices"),
    }
    del facts["gpu02"]
    text = build(
        InitOptions(name="lab2", source=f"{src}"),
        inv,
        facts,
        {"gpu02": "cannot reach 10.0.0.12:22: timed out"},
        "2.13.0",
    )
    out = tmp_path / "hosts.yml"
    out.write_text(text)
    back = load(str(out))
    assert {h.name: (h.address, h.port, h.user, [str(j) for j in h.jump]) for h in back.hosts} == {
        "gpu01": ("10.0.0.11", 22, "ops", ["ops@bastion"]),
        "gpu02": ("10.0.0.12", 22, "ops", ["ops@bastion"]),
        "login01": ("10.0.0.5", 2222, "ops", ["ops@bastion"]),
    }
    assert back.direct["gpus"] == ["gpu01", "gpu02"] and back.direct["login"] == ["login01"]
    assert (
        back.host("login01").vars.get("cpu_only") is True
        and "cpu_only" not in back.host("gpu01").vars
    )
    assert "8x NVIDIA A100-SXM4-80GB (8.0), driver 535.104.05" in text
    assert "gpu02: NOT REACHED: cannot reach 10.0.0.12:22: timed out" in text
    assert "torch-plan: x86_64 torch==2.13.0+cu" in text and 'torch_version: "2.13.0"' in text
    assert back.host("gpu01").vars["python"] == "/usr/bin/python3"


def test_a_hostfile_source_keeps_its_slots(tmp_path):
    hf = tmp_path / "hostfile"
    hf.write_text("node1 slots=4\nnode2 slots=4\n")
    inv = load(f"hostfile:{hf}", extra_vars={"user": "train"})
    text = build(
        InitOptions(name="hf", source=f"hostfile:{hf}"),
        inv,
        {},
        {"node1": "x", "node2": "y"},
        "2.13.0",
    )
    (tmp_path / "hosts.yml").write_text(text)
    back = load(str(tmp_path / "hosts.yml"))
    assert [(h.name, h.slots, h.user) for h in back.hosts] == [
        ("node1", 4, "train"),
        ("node2", 4, "train"),
    ]


def test_refusals(tmp_path):
    settings = NodeprepSettings(project_root=str(tmp_path))
    (tmp_path / "inventory" / "have").mkdir(parents=True)
    (tmp_path / "inventory" / "have" / "hosts.yml").write_text("hosts: {a: {}}\n")
    with pytest.raises(InputError, match="exists"):
        _target(InitOptions(name="have", source="hosts:a"), settings)
    assert (
        _target(InitOptions(name="have", source="hosts:a", force=True), settings).name
        == "hosts.yml"
    )
    with pytest.raises(InputError, match="not usable"):
        _target(InitOptions(name="../x", source="hosts:a"), settings)
    with pytest.raises(InputError, match="--from is missing"):
        _target(InitOptions(name="new", source=None), settings)


@settings(max_examples=300, deadline=None)
@given(st.text(st.characters(blacklist_categories=("Cs",)), max_size=40))
def test_any_text_reads_back_literally(value):
    """Whatever a source said reaches the file literally (property: hypothesis)."""
    assert yaml.safe_load("{k: " + writer.scalar(value) + "}")["k"] == value
