from pathlib import Path

import pytest

from nodeprep.errors import InputError
from nodeprep.inventory.schema import VarSpec, check_value, load_schema

DATA = Path(__file__).parent / "data"


def spec(name, default, kind):
    return VarSpec(name, default, kind, doc="doc", source="test:1")


def write(root: Path, role: str, text: str):
    path = root / "roles" / role / "defaults.yml"
    path.parent.mkdir(parents=True)
    path.write_text(text)


def test_core_and_role_variables():
    schema = load_schema([DATA])
    assert schema["port"].kind == "int" and schema["port"].default == 22
    assert schema["cpu_only"].kind == "bool"
    assert schema["slots"].kind == "int" and schema["slots"].default is None
    assert schema["ssh_mesh"].doc.startswith("Give every node")
    kinds = {
        n: schema[n].kind for n in ("cuda_version", "extra_packages", "nccl_timeout", "launch_env")
    }
    assert kinds == {
        "cuda_version": "str",
        "extra_packages": "list",
        "nccl_timeout": "float",
        "launch_env": "dict",
    }
    assert schema["ssh_mesh"].source.endswith("roles/mesh/defaults.yml:4")


def test_no_roles_dir_gives_core_only(tmp_path):
    assert set(load_schema([tmp_path])) == {
        "address",
        "port",
        "user",
        "key",
        "proxy_jump",
        "slots",
        "cpu_slots",
        "connection",
        "cpu_only",
        "python",
        "train_restarts",
        "train_retry_on",
        "train_min_nodes",
        "train_resume_args",
        "stages",
    }


def test_null_role_default_is_any(tmp_path):
    write(tmp_path, "r", "# anything goes\nblob: null\n")
    assert load_schema([tmp_path])["blob"].kind == "any"


def test_undocumented_variable_is_an_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "r", "# documented\na: 1\n\nb: 2\n")
    with pytest.raises(InputError) as err:
        load_schema([tmp_path])
    assert str(err.value).startswith("roles/r/defaults.yml:4: variable 'b' has no documentation")
    assert err.value.exit_code == 2


def test_variable_in_two_roles_is_an_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "a", "# x\nshared: 1\n")
    write(tmp_path, "b", "# y\n\n# x again\nshared: 2\n")
    with pytest.raises(
        InputError,
        match=r"^roles/b/defaults.yml:4: variable 'shared' is "
        r"already defined at roles/a/defaults.yml:2",
    ):
        load_schema([tmp_path])


def test_role_redefining_core_variable_is_an_error(tmp_path):
    write(tmp_path, "a", "# mine\nport: 2222\n")
    with pytest.raises(InputError, match="already defined at .*defaults.yml:9"):
        load_schema([tmp_path])


def test_malformed_defaults_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "a", "# x\nfoo: [1, 2\n")
    with pytest.raises(InputError, match=r"^roles/a/defaults.yml:\d+: invalid YAML"):
        load_schema([tmp_path])


@pytest.mark.parametrize(
    "kind, default, value, problem",
    [
        ("bool", False, True, None),
        (
            "bool",
            False,
            "yes",
            'expected true or false, got the string "yes": use true or false without quotes',
        ),
        ("bool", False, "True", "without quotes"),
        ("bool", False, 1, "expected true or false, got the number 1"),
        ("int", 1, 8, None),
        ("int", 1, "8", None),
        ("int", 1, "abc", 'expected a whole number, got the string "abc"'),
        ("int", 1, True, "expected a whole number, got true"),
        ("int", 1, 1.5, "expected a whole number, got the number 1.5"),
        ("int", 1, None, "got null (remove the line to use the default 1)"),
        ("float", 1.0, 3, None),
        ("float", 1.0, "2.5", None),
        ("float", 1.0, "x", "expected a number"),
        ("str", "a", "b", None),
        ("str", "a", 1000, None),
        ("str", "a", 2.1, "expected a string, got the number 2.1: quote it"),
        ("str", "a", {"k": 1}, "expected a string, got a mapping"),
        ("str", "a", ["b"], "expected a string, got a list"),
        ("str", "a", True, "expected a string, got true: quote it"),
        ("str", None, None, None),
        ("list", [], ["a"], None),
        ("list", [], "a", 'expected a list, got the string "a"'),
        ("dict", {}, [], "expected a mapping, got a list"),
        ("any", None, {"x": [1]}, None),
    ],
)
def test_check_value(kind, default, value, problem):
    reason = check_value(spec("v", default, kind), value)
    assert reason == problem if problem is None else problem in reason


@pytest.mark.parametrize(
    "value, problem",
    [
        (22, None),
        ("2222", None),
        (65535, None),
        (0, "port must be 1..65535, got 0"),
        (70000, "port must be 1..65535, got 70000"),
    ],
)
def test_port_bounds(value, problem):
    assert check_value(load_schema([])["port"], value) == problem
