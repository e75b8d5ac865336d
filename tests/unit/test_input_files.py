"""Every file the user hands nodeprep besides the inventory (requirements files, the parity
baseline, the pinned known_hosts, the job directory) and the --set values: bytes that are not
UTF-8, a NUL, a file that cannot be read, or a value PyYAML or packaging chokes on are ONE
InputError line (exit 2) naming file:line, never a traceback (issue 16)."""

from pathlib import Path

import pytest

from nodeprep.commands.common import parse_sets
from nodeprep.engine import hostkeys
from nodeprep.errors import InputError
from nodeprep.inventory import model
from nodeprep.inventory.yamlfile import read_input
from nodeprep.ops import pystack
from nodeprep.ops.provision.roles import Provisioning
from nodeprep.ops.pystack.wheelhouse import read_requirements
from nodeprep.ops.train import payload
from nodeprep.ops.verify.parity import baseline_read
from nodeprep.settings import Settings, find_project

ROOT = find_project(Path(__file__).parent)


def one_line(err: InputError, start: str) -> None:
    text = str(err)
    assert err.exit_code == 2 and "\n" not in text and text.startswith(start), text


@pytest.mark.parametrize(
    "data, line, words",
    [
        (b"ok\n\xffbad\n", 2, "byte 0xff at column 1 is not UTF-8 text"),
        (b"ok\nab\xe9\n", 2, "byte 0xe9 at column 3 is not UTF-8 text"),
        (
            "ok\n\u00e9\u00e9".encode() + b"\xc3(\n",
            2,
            "byte 0xc3 at column 3",
        ),  # columns in characters
        (b"\xef\xbb\xbfa\n\xff", 2, "byte 0xff at column 1"),  # after a BOM
    ],
)
def test_read_input_names_the_line_of_a_byte_that_is_not_utf8(tmp_path, data, line, words):
    path = tmp_path / "f"
    path.write_bytes(data)
    with pytest.raises(InputError) as err:
        read_input(path)
    one_line(err.value, f"{path}:{line}: {words}")


def test_read_input_drops_a_bom_and_refuses_what_cannot_be_read(tmp_path):
    (tmp_path / "f").write_bytes(b"\xef\xbb\xbfhosts:\n")
    assert read_input(tmp_path / "f") == "hosts:\n"
    for path, words in [
        (tmp_path, "cannot read: Is a directory"),
        (tmp_path / "none", "file not found"),
        (tmp_path / "a\0b", "cannot read: embedded null byte"),
    ]:
        with pytest.raises(InputError) as err:
            read_input(path)
        one_line(err.value, f"{path}: {words}".replace("\0", "\\x00"))


@pytest.mark.parametrize(
    "data, words",
    [
        (b"pip==26.3\nnumpy==2\xff\n", "byte 0xff at column 9 is not UTF-8 text"),
        (b"pip==26.3\nnumpy==2.0\0\n", "not a requirement: Expected"),
        (b"pip==26.3\nnumpy==2; " + b"(" * 3000 + b"\n", "not a requirement: nested too deeply"),
    ],
)
def test_requirements_file_errors_name_the_line(tmp_path, data, words):
    path = tmp_path / "req.txt"
    path.write_bytes(data)
    with pytest.raises(InputError) as err:
        read_requirements([path])
    one_line(err.value, f"{path}:2: {words}")


def test_requirements_file_that_cannot_be_read(tmp_path, monkeypatch):
    path = tmp_path / "req.txt"
    path.write_text("pip==26.3\n")

    def denied(self):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", denied)
    with pytest.raises(InputError) as err:
        read_requirements([path])
    one_line(err.value, f"{path}: cannot read: Permission denied")


def test_requirements_path_of_an_unknown_users_home(tmp_path, monkeypatch):
    """`python_requirements: [~nosuchuser/req.txt]` was a RuntimeError from expanduser."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hosts.yml").write_text(
        "vars:\n  python_requirements: [~nosuchuser/r.txt]\nhosts:\n  a:\n"
    )
    inv = model.load("hosts.yml", root=ROOT)
    prov = Provisioning(
        inventory=inv,
        hosts=inv.hosts,
        settings=Settings(project_root=str(ROOT)),
        vars={h.name: h.vars for h in inv.hosts},
    )
    with pytest.raises(InputError) as err:
        pystack.requirement_pins(prov)
    one_line(err.value, "hosts.yml:2: python_requirements: a `~user/` path of an unknown user")


@pytest.mark.parametrize(
    "data, line, words",
    [
        (b'{"format": "nodeprep-fingerprint",\n "x": "\xff"}', 2, "byte 0xff at column 8"),
        (
            b'{"format": "nodeprep-fingerprint", "version": ' + b"9" * 5000 + b"}",
            None,
            "not a fingerprint file: a number too long or values nested too deeply",
        ),
        (b"[" * 100000 + b"]" * 100000, None, "not a fingerprint file"),
        (b'{"format": "nodeprep-fingerprint",\n\0}', 2, "not valid JSON"),
    ],
)
def test_baseline_that_is_not_text_or_json(tmp_path, data, line, words):
    path = tmp_path / "base.json"
    path.write_bytes(data)
    with pytest.raises(InputError) as err:
        baseline_read(path)
    one_line(err.value, f"{path}:{line}: {words}" if line else f"{path}: {words}")


def test_baseline_path_with_a_nul_is_not_found(tmp_path):
    with pytest.raises(InputError) as err:
        baseline_read(tmp_path / "a\0b")
    one_line(err.value, f"{tmp_path}/a\\x00b: baseline file not found")


@pytest.mark.parametrize(
    "data, line, words",
    [
        (
            b"10.0.0.1 ssh-ed25519 "
            b"AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n"
            b"10.0.0.2 ssh-ed25519 \xff\n",
            2,
            "byte 0xff at column 22 is not UTF-8 text",
        ),
        (b"# pinned\n10.0.0.2 ssh-ed25519 AAAA!!notbase64\n", 2, "not a known_hosts line"),
        (
            b"\n10.0.0.2 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAABWFiY2Rl\n",
            2,
            "not a known_hosts line: The key must be exactly 32 bytes long",
        ),  # base64, but no key
    ],
)
def test_known_hosts_file_edited_wrong(tmp_path, data, line, words):
    path = tmp_path / "known_hosts"
    path.write_bytes(data)
    store = hostkeys.PinnedHostKeys(path)
    with pytest.raises(InputError) as err:
        store.load()
    one_line(err.value, f"{path}:{line}: {words}")
    with pytest.raises(InputError):
        store.lookup("10.0.0.2")
    if b"\xff" in data:  # pin and forget rewrite the file as text
        with pytest.raises(InputError):
            store.forget("x")


@pytest.mark.parametrize(
    "value", ["!!int", "9" * 5000, "2001-13-45", "[" * 2000, "!!map x", "!!seq x", "{a: !!float }"]
)
def test_set_values_that_pyyaml_cannot_make(value):
    with pytest.raises(InputError) as err:
        parse_sets([f"x={value}"])
    one_line(err.value, "--set x: value is not valid YAML")


def test_job_file_that_cannot_be_read(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "data.bin").write_bytes(b"\0")
    real = Path.open

    def guarded(self, mode="r", *a, **kw):
        if self.name == "data.bin":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, mode, *a, **kw)

    monkeypatch.setattr(Path, "open", guarded)
    with pytest.raises(InputError) as err:
        payload.local_files(tmp_path, tmp_path / "train.py")
    one_line(
        err.value,
        f"{tmp_path / 'data.bin'}: cannot read this file of the job directory: Permission denied",
    )


def test_payload_in_an_unknown_users_home():
    with pytest.raises(InputError) as err:
        payload.resolve_payload("~nosuchuser/train.py")
    one_line(err.value, "--payload '~nosuchuser/train.py': not a builtin")
