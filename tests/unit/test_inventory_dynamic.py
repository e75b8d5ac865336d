"""Dynamic inventories: what an inventory script prints, read as JSON with ansible-core's
script plugin's semantics, from the script itself or from a `.json` file holding its output
(inventory/dynamic.py, inventory/jsonfile.py).

The fast tests pin the parser and the messages. test_shape_reads_like_ansible runs each shape
of SHAPES and REFUSED through the reference ansible-inventory (a script printing it) and
through nodeprep (the same script, and the `.json` file when nodeprep takes it for script
output): the same view, or both refuse.
"""

from __future__ import annotations

import difflib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from nodeprep.commands.inventory import InventoryView
from nodeprep.errors import InputError
from nodeprep.inventory import dynamic
from nodeprep.inventory.jsonfile import NotJson, load_file, load_json
from nodeprep.inventory.model import load
from nodeprep.inventory.schema import load_schema
from nodeprep.settings import find_project
from tests.unit.test_inventory_differential import (
    ansible_json,
    ansible_list,
    ansible_view,
    nodeprep_view,
    output_script,
    render,
    require_ansible,
    unsafe_fields,
)

ROOT = find_project()
SCHEMA = load_schema([ROOT])


def _load(path: Path, **kw):
    return load(str(path), schema=SCHEMA, root=ROOT, **kw)


def _file(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# -- the JSON parser ---------------------------------------------------------------------------


def test_json_keeps_the_line_of_every_key_and_item():
    text = '{\n\t"a": {\n\t\t"hosts": [\n\t\t\t"x",\n\t\t\t"y"\n\t\t]},\n\t"b"\n\t:\n\t1\n}\n'
    data = load_json(text, "out")
    assert data == {"a": {"hosts": ["x", "y"]}, "b": 1}
    assert (data.file, data.line, data.lines) == ("out", 1, {"a": 2, "b": 7})
    assert data["a"].lines == {"hosts": 3} and data["a"]["hosts"].lines == [4, 5]
    assert data["a"]["hosts"].file == "out"


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"a": 1,\n "a": 2}', "out:2: duplicate key 'a' (first at line 1)"),
        ("[" * 101 + "]" * 101, "out:1: values nested more than 100 deep"),
        ('{"a":\n' + "9" * 5000 + "}", "out:2: a number 5000 characters long"),
        ('{"h": {"__ansible_unsafe": 5}}', "out:1: __ansible_unsafe holds no string"),
        ('{"a": [1,}', "out:1: invalid JSON: Expecting value (column 10)"),
        ("all:\n  hosts: {}\n", "out:1: invalid JSON: Expecting value (column 1)"),
    ],
)
def test_bad_json_is_one_line_naming_the_line(text, message):
    with pytest.raises(InputError) as err:
        load_json(text, "out")
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_a_string_ansible_will_not_template_is_that_string():
    """How ansible-inventory --list writes a malformed group's variables (2.19)."""
    data = load_json('{"h": {"ansible_host": {"__ansible_unsafe": "192.0.2.5"}}}', "out")
    assert data == {"h": {"ansible_host": "192.0.2.5"}}


def test_a_file_is_read_as_json_first_then_yaml(tmp_path):
    """Ansible's loader: json.loads first (tabs are JSON's whitespace, 1e3 its number), YAML
    when that fails."""
    assert load_file(_file(tmp_path, "a.yml", '{\n\t"all": {"vars": {"x": 1e3}}\n}\n')) == {
        "all": {"vars": {"x": 1000.0}}
    }
    assert load_file(_file(tmp_path, "b.yml", "all:\n  vars: {x: 1e3}\n")) == {
        "all": {"vars": {"x": "1e3"}}
    }
    assert load_file(_file(tmp_path, "c.yml", "")) is None
    with pytest.raises(InputError, match=r"c\.json:2: invalid JSON"):
        load_file(_file(tmp_path, "c.json", '{\n\t"a": }\n'))
    with pytest.raises(InputError, match=r"d\.yml:2: invalid YAML"):
        load_file(_file(tmp_path, "d.yml", '{\n\t"a": }\n'))
    with pytest.raises(InputError) as err:  # valid JSON refused: no YAML second try
        load_file(_file(tmp_path, "e.yml", '{"a": 1, "a": 2}'))
    assert not isinstance(err.value, NotJson) and "duplicate key 'a'" in str(err.value)


# -- which files are script output -------------------------------------------------------------


@pytest.mark.parametrize(
    "name, text, expected",
    [
        ("h.json", '{"g": ["h1"]}', True),
        ("h.json", '{"g": {"hosts": ["h1"], "vars": {}}}', True),
        ("h.json", '{"g": {"children": ["k"]}}', True),
        ("h.json", '{"_meta": {}}', True),
        ("h.json", '{"all": {"hosts": {"h1": null}}}', False),  # Ansible's YAML inventory shape
        ("h.json", '{"g": {"vars": {"x": 1}}}', False),  # both shapes: the yaml plugin's
        ("h.yml", '{"all": {"hosts": ["h1"]}}', False),  # a YAML inventory with a list
        ("h.yml", '{"_meta": {"hostvars": {}}}', True),  # ansible-inventory --list
    ],
)
def test_which_documents_are_script_output(tmp_path, name, text, expected):
    path = _file(tmp_path, name, text)
    assert dynamic.is_list_json(load_file(path), path) is expected


# -- scripts -----------------------------------------------------------------------------------


def _script(tmp_path: Path, list_text: str, host_text: str = "{}") -> Path:
    out = _file(tmp_path, "list.out", list_text)
    host = _file(tmp_path, "host.out", host_text)
    path = _file(
        tmp_path,
        "inv.sh",
        f'#!/bin/sh\nif [ "$1" = --list ]; then cat {out}; else cat {host}; fi\n',
    )
    path.chmod(0o755)
    return path


def test_a_script_printing_tab_indented_json_is_read(tmp_path):
    path = _script(
        tmp_path,
        '{\n\t"gpus": {\n\t\t"hosts": ["g1"]\n\t},\n\t"_meta": {\n\t\t"hostvars": '
        '{"g1": {\n\t\t\t"ansible_host": "192.0.2.1"}}}\n}\n',
    )
    inv = _load(path)
    assert [(h.name, h.address, h.groups) for h in inv.hosts] == [("g1", "192.0.2.1", ("gpus",))]


def test_a_script_printing_yaml_is_refused_as_not_json(tmp_path):
    path = _script(tmp_path, "gpus:\n  hosts: [g1]\n")
    with pytest.raises(InputError) as err:
        _load(path)
    assert str(err.value).startswith(f"{path} --list:1: invalid JSON") and err.value.exit_code == 2


def test_host_answers_are_json_and_nothing_is_no_variables(tmp_path):
    path = _script(tmp_path, '{"g": ["h1"]}', "")
    assert _load(path).hosts[0].extra == {}
    path = _script(tmp_path, '{"g": ["h1"]}', '{\n\t"ansible_port": 2201\n}')
    assert _load(path).hosts[0].port == 2201
    path = _script(tmp_path, '{"g": ["h1"]}', "null")
    with pytest.raises(
        InputError, match=r"--list:1: the variables of host 'h1' must be a mapping, not null"
    ):
        _load(path)


# -- hosts only _meta names, no hosts at all ----------------------------------------------------


def test_hosts_only_hostvars_name_are_no_hosts_and_are_named(tmp_path):
    path = _file(
        tmp_path,
        "out.json",
        '{"g": ["h1"],\n "_meta": {"hostvars": {"h1": {},\n'
        ' "x1": {}, "x2": {}, "x3": {}, "x4": {}}}}\n',
    )
    inv = _load(path)
    assert [h.name for h in inv.hosts] == ["h1"]
    assert inv.warnings == [
        f"{path}:3: _meta.hostvars names 4 host(s) that no group lists (x1, x2, x3 and 1 more): "
        'they are not hosts, as for Ansible; list each under a group, or under "ungrouped"'
    ]


def test_an_inventory_left_without_hosts_says_so(tmp_path):
    path = _file(
        tmp_path, "out.json", '{"_meta": {"hostvars": {"x1": {"ansible_host": "192.0.2.1"}}}}'
    )
    inv = _load(path)
    assert inv.hosts == [] and len(inv.warnings) == 2
    assert inv.warnings[1] == (
        f"{path}: no group lists a host, so the inventory has no hosts "
        '(list them: "ungrouped": {"hosts": ["h1"]})'
    )
    with pytest.raises(InputError, match=r"has no hosts"):  # what every command then says
        inv.select(None)


def test_a_json_file_without_meta_says_its_hosts_have_group_variables_only(tmp_path):
    path = _file(tmp_path, "out.json", '{"g": {"hosts": ["h1"], "vars": {"ansible_user": "u"}}}')
    inv = _load(path)
    assert inv.hosts[0].user == "u" and "cannot be asked `--host NAME`" in inv.warnings[0]


# -- refusals: one line, file:line, what to write ----------------------------------------------


@pytest.mark.parametrize(
    "text, message",
    [
        (
            '{"_meta": {"hostvars": {}},\n "g": null}',
            ":2: group 'g' must be a list of hosts or a mapping",
        ),
        (
            '{"g": {"hosts": "h1"}, "_meta": {"hostvars": {}}}',
            ":1: the hosts of group 'g' must be a list of names, not a string",
        ),
        ('{"g": {"hosts": [\n"h1",\n 7]}}', ":3: group 'g' lists a number as a host"),
        ('{"g": {"hosts": [""]}}', ":1: group 'g' lists an empty name as a host"),
        (
            '{"g": {"hosts": ["h1"], "vars": []}}',
            ":1: the vars of group 'g' must be a mapping, not a list",
        ),
        (
            '{"g": {"hosts": ["h1"], "children": null}}',
            ":1: the children of group 'g' must be a list",
        ),
        (
            '{"g": {"hosts": ["h1"], "children": ["g"]}}',
            ":1: group 'g' lists 'g' as its child: a loop",
        ),
        ('{"g": {"hosts": ["h1"], "children": ["all"]}}', ":1: group 'g' lists 'all' as its child"),
        ('{"g": ["h1"], "_meta": []}', ":1: '_meta' must be a mapping, not a list"),
        (
            '{"g": ["h1"], "_meta": {}}',
            ":1: '_meta' needs 'hostvars', a mapping of host: variables (it has none)",
        ),
        (
            '{"g": ["h1"], "_meta": {"hostvars": {}, "profile": "x"}}',
            ":1: '_meta' names the profile 'x'",
        ),
        (
            '{"g": ["h1"], "_meta": {"hostvars": {\n"h1": []}}}',
            ":2: the variables of host 'h1' must be a mapping",
        ),
        (
            '{"g": ["h1"], "_meta": {"hostvars": {"h1": {"ansible_port": "x"}}}}',
            ":1: variable 'ansible_port'",
        ),
    ],
)
def test_refused_shapes_are_one_line_naming_file_and_line(tmp_path, text, message):
    path = _file(tmp_path, "out.json", text)
    with pytest.raises(InputError) as err:
        _load(path)
    assert str(err.value).startswith(f"{path}{message}"), str(err.value)
    assert err.value.exit_code == 2 and "\n" not in str(err.value) and err.value.hint


# -- each shape against the reference Ansible --------------------------------------------------

SHAPES = {
    "list group": {"g": ["h1", "h2"]},
    "mapping group": {
        "g": {"hosts": ["h1"], "vars": {"ansible_user": "u", "ansible_port": "2201"}}
    },
    "children and their vars": {
        "top": {"children": ["mid"], "vars": {"ansible_user": "top"}},
        "mid": {"children": ["low"], "vars": {"ansible_user": "mid"}},
        "low": {"hosts": ["h1"]},
        "other": ["h2"],
    },
    "children as a mapping": {"p": {"children": {"k": {"hosts": ["not-a-host"]}}}, "k": ["h1"]},
    "children as a string": {"p": {"children": "ab"}, "a": ["h1"], "b": ["h2"]},
    "a child nobody defines": {"p": {"hosts": ["h1"], "children": ["ghost"]}},
    "a malformed group is a host": {
        "web1": {"ansible_host": "192.0.2.5", "ansible_port": 2222},
        "_meta": {"hostvars": {}},
    },
    "an empty group mapping is a host": {"solo": {}, "_meta": {"hostvars": {}}},
    "hosts of all are ungrouped": {
        "all": {"hosts": ["h1"], "vars": {"ansible_user": "a"}, "children": ["g"]},
        "g": ["h2"],
    },
    "ungrouped with vars": {
        "ungrouped": {"hosts": ["h1", "h2"], "vars": {"ansible_port": 2200}},
        "g": ["h2"],
    },
    "meta beats groups": {
        "g": {"hosts": ["h1"], "vars": {"ansible_user": "group"}},
        "_meta": {"hostvars": {"h1": {"ansible_user": "host"}}},
    },
    "hostvars for hosts in no group": {
        "g": ["h1"],
        "_meta": {"hostvars": {"h1": {}, "x9": {"ansible_port": 9}}},
    },
    "only hostvars": {"_meta": {"hostvars": {"x9": {"ansible_host": "192.0.2.9"}}}},
    "nothing": {},
    "a host listed twice": {"g": ["h1", "h1"], "k": {"hosts": ["h1"]}},
    "the profile --list writes": {
        "g": ["h1"],
        "_meta": {"hostvars": {}, "profile": "inventory_legacy"},
    },
    "unsafe strings": {
        "g": ["h1"],
        "_meta": {"hostvars": {"h1": {"ansible_host": {"__ansible_unsafe": "192.0.2.7"}}}},
    },
    "junk keys in a group": {"g": {"hosts": ["h1"], "junk": 5}},
}
REFUSED = {
    "a null group": {"g": None},
    "a string group": {"g": "h1"},
    "a number group": {"g": 5},
    "null hosts": {"g": {"hosts": None}},
    "mapping hosts": {"g": {"hosts": {"h1": None}}},
    "a number host": {"g": [1]},
    "an empty host": {"g": [""]},
    "a list host": {"g": [["h1"]]},
    "null vars": {"g": {"hosts": ["h1"], "vars": None}},
    "list vars": {"g": {"vars": ["x"]}},
    "null children": {"g": {"children": None}},
    "a number child": {"g": {"children": [1]}},
    "its own child": {"g": {"children": ["g"]}},
    "all as a child": {"g": {"children": ["all"]}},
    "a loop": {"a": {"children": ["b"]}, "b": {"children": ["a"], "hosts": ["h1"]}},
    "meta a list": {"g": ["h1"], "_meta": []},
    "meta without hostvars": {"g": ["h1"], "_meta": {}},
    "hostvars a list": {"_meta": {"hostvars": []}},
    "null hostvars of a host": {"g": ["h1"], "_meta": {"hostvars": {"h1": None}}},
    "another profile": {"g": ["h1"], "_meta": {"hostvars": {}, "profile": "inventory_other"}},
    "a list": [],
    "unsafe not a string": {
        "g": ["h1"],
        "_meta": {"hostvars": {"h1": {"x": {"__ansible_unsafe": 1}}}},
    },
}
CASES = {
    **{k: json.dumps(v, indent="\t") for k, v in {**SHAPES, **REFUSED}.items()},
    "not JSON": "g:\n  hosts: [h1]\n",
    "no output": "",
}


@pytest.fixture(scope="module")
def ansible_runs(tmp_path_factory):
    """Ansible's run of every case, all at once."""
    if not os.access(ROOT / ".venv-ansible" / "bin" / "ansible-inventory", os.X_OK):
        return {}
    folder = tmp_path_factory.mktemp("outputs")
    paths = {
        name: _file(folder, f"case{i}.json", text) for i, (name, text) in enumerate(CASES.items())
    }
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        futures = {name: pool.submit(ansible_list, path, True) for name, path in paths.items()}
        return {name: f.result() for name, f in futures.items()}


def _ours(path: Path, check: bool) -> dict:
    return nodeprep_view(InventoryView(_load(path, check_fields=check)).as_dict())


@pytest.mark.slow(reason="one ansible-inventory run per shape (tests/ansible_oracle.py)")
@pytest.mark.parametrize("name", CASES)
def test_shape_reads_like_ansible(name, ansible_runs, tmp_path):
    require_ansible()
    ans = ansible_runs[name]
    out = _file(tmp_path, "out.json", CASES[name])
    script = output_script(out, tmp_path)
    if ans.rc != 0:
        assert name in REFUSED or name in ("not JSON", "no output"), ans.describe()
        with pytest.raises(InputError):
            _load(script)
        return
    assert name in SHAPES, f"Ansible reads {name!r}: move it to SHAPES"
    theirs = ansible_view(ansible_json(ans.stdout), tmp_path)
    check = not unsafe_fields(theirs)
    sources = [script] + ([out] if dynamic.is_list_json(load_file(out), out) else [])
    for source in sources:
        ours = _ours(source, check)
        if ours != theirs:
            diff = difflib.unified_diff(
                render(theirs), render(ours), "ansible-inventory", "nodeprep", lineterm=""
            )
            pytest.fail(
                f"{name} ({source.name}): nodeprep reads it differently\n" + "\n".join(diff),
                pytrace=False,
            )
