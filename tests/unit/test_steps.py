"""Block editing, file checks, redaction, NCCL proposals, role selection: the decision logic
of provision without a node."""

import base64
import os
import subprocess

import pytest

from nodeprep.commands.common import parse_sets
from nodeprep.engine import steps
from nodeprep.engine.facts.files import parse_file
from nodeprep.engine.remote import rpath, write_script
from nodeprep.errors import InputError, NodeprepError
from nodeprep.ops.launchenv import ncclenv
from nodeprep.ops.provision import roles
from nodeprep.redact import Redactor, is_secret
from nodeprep.settings import find_project

B, E = steps.begin_marker("x"), steps.end_marker("x")
ROLES = find_project() / "roles"


@pytest.mark.parametrize(
    "old,where,new",
    [
        (None, "bottom", f"{B}\nbody\n{E}\n"),
        ("user\n", "bottom", f"user\n{B}\nbody\n{E}\n"),
        ("user", "bottom", f"user\n{B}\nbody\n{E}\n"),
        ("user\n", "top", f"{B}\nbody\n{E}\nuser\n"),
        (f"a\r\n{B}\nold\nstuff\n{E}\nz  \n", "top", f"a\r\n{B}\nbody\n{E}\nz  \n"),
    ],
)
def test_with_block_keeps_everything_outside(old, where, new):
    assert steps.with_block(old, "x", "body\n", where) == new


def test_with_block_is_idempotent_and_empty_body():
    once = steps.with_block("keep\n", "x", "a\nb\n")
    assert steps.with_block(once, "x", "a\nb\n") == once
    assert steps.with_block(once, "x", "") == f"keep\n{B}\n{E}\n"


def _file(content, mode=0o644):
    return {
        "file:/f": {
            "exists": content is not None,
            "mode": mode if content is not None else None,
            "size": len(content or ""),
            "content": content,
        }
    }


def test_file_content_check_and_diff():
    st = steps.FileContent("/f", "A=1\n", 0o600)
    assert st.check(_file("A=1\n", 0o600)).ok
    c = st.check(_file("A=2\n", 0o600))
    assert (c.ok, c.why) == (False, "content differs") and "-A=2" in c.diff and "+A=1" in c.diff
    assert st.check(_file("A=1\n", 0o644)).why == "mode 644, want 600"
    assert st.check(_file(None)).why == "missing"


def test_file_block_action_keeps_mode_of_existing_file():
    st = steps.FileBlock("/f", "x", "body\n")
    assert not st.check(_file("u\n", 0o640)).ok
    script = steps.action_for(st, _file("u\n", 0o640))
    assert "chmod 640" in script


def test_write_script_is_atomic_and_quoted(tmp_path):
    target = tmp_path / "it's here" / "f"
    script = write_script(str(target), "x'y\n$(boom)\n", 0o600)
    subprocess.run(["/bin/sh", "-c", script], check=True)
    assert target.read_text() == "x'y\n$(boom)\n"
    assert target.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in target.parent.iterdir()] == ["f"]
    assert rpath("~/a b") == "\"$HOME\"/'a b'"


def test_parse_file_reads_back_what_read_script_prints(tmp_path):
    from nodeprep.engine.facts.files import read_many_script as read

    f = tmp_path / "c"
    f.write_text("hello\n")
    f.chmod(0o640)
    out = subprocess.run(["/bin/sh", "-c", read([str(f)])], capture_output=True, text=True).stdout
    assert parse_file(out, 0) == {"exists": True, "mode": 0o640, "size": 6, "content": "hello\n"}
    out = subprocess.run(
        ["/bin/sh", "-c", read([str(tmp_path / "no")])], capture_output=True, text=True
    ).stdout
    assert parse_file(out, 0)["exists"] is False


def test_many_files_in_one_section(tmp_path):
    """One stat and one cat for all files: missing ones, empty ones, binary bytes, a name with
    a space, a symlink (its target is read), one over MAX_READ (mode and size, no content),
    in the order asked; a directory in the list is refused by name."""
    from nodeprep.engine import facts
    from nodeprep.engine.facts.files import MAX_READ

    (tmp_path / "a").write_text("hello\n")
    (tmp_path / "a").chmod(0o640)
    (tmp_path / "b").write_bytes(b"\x00\xffbin")
    (tmp_path / "e").write_text("")
    (tmp_path / "s p").write_text("x y")
    (tmp_path / "big").write_bytes(b"z" * (MAX_READ + 1))
    (tmp_path / "ln").symlink_to(tmp_path / "a")
    names = ["a", "missing", "b", "e", "big", "s p", "ln"]
    reqs = [facts.FILE(str(tmp_path / n)) for n in names] + [facts.USER]
    script = facts.probe_script(reqs, {}, "tok")
    assert script.count("@@tok:rc=") == 2  # the files share ONE section
    out = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True).stdout
    got = facts.parse_sections("n", reqs, out, "tok", 0)
    f = {n: got[f"file:{tmp_path / n}"] for n in names}
    assert f["a"] == {"exists": True, "mode": 0o640, "size": 6, "content": "hello\n"}
    assert f["missing"]["exists"] is False
    assert f["b"]["content"].encode("utf-8", "surrogateescape") == b"\x00\xffbin"
    assert f["e"]["content"] == "" and f["s p"]["content"] == "x y"
    assert f["big"] == {"exists": True, "mode": 0o644, "size": MAX_READ + 1, "content": None}
    assert f["ln"]["content"] == "hello\n" and f["ln"]["mode"] == 0o640
    assert got["user"]["uid"] == os.getuid()
    only_empty = facts.probe_script([facts.FILE(str(tmp_path / "e"))], {}, "t")
    out = subprocess.run(["/bin/sh", "-c", only_empty], capture_output=True, text=True).stdout
    assert (
        facts.parse_sections("n", [facts.FILE(str(tmp_path / "e"))], out, "t", 0)[
            f"file:{tmp_path / 'e'}"
        ]["content"]
        == ""
    )
    (tmp_path / "d").mkdir()
    reqs = [facts.FILE(str(tmp_path / "a")), facts.FILE(str(tmp_path / "d"))]
    out = subprocess.run(
        ["/bin/sh", "-c", facts.probe_script(reqs, {}, "t")], capture_output=True, text=True
    ).stdout
    with pytest.raises(NodeprepError, match="d exists but is not a regular file") as e:
        facts.parse_sections("worker-3", reqs, out, "t", 0)
    # file contents may be secrets (~/.deepspeed_env): the error never quotes the answer
    assert base64.b64encode(b"hello").decode()[:6] not in str(e.value) and "output was" not in str(
        e.value
    )


def test_file_that_changed_size_while_read_is_refused():
    from nodeprep.engine.facts.files import split_files

    # stat said 6 bytes, cat then delivered 9
    out = "F\n644:6\n@@DATA@@\n" + base64.b64encode(b"hello\nxx\n").decode()
    with pytest.raises(ValueError, match="changed size"):
        split_files(out, 0, ["~/.ssh/known_hosts"])


def test_redaction():
    assert is_secret("WANDB_API_KEY") and is_secret("hf_token") and not is_secret("HF_HOME")
    r = Redactor(["s3cr3t-value", "-----BEGIN KEY-----\nAAAABBBBCCCCDDDD\n-----END KEY-----"])
    assert r("X=s3cr3t-value") == "X=<redacted>"
    assert r("+AAAABBBBCCCCDDDD") == "+<redacted>"


@pytest.mark.parametrize(
    "ifs,addrs,expected",
    [
        (
            {
                "a": {"lo": ["127.0.0.1"], "eth0": ["10.0.0.1"], "docker0": ["172.17.0.1"]},
                "b": {"lo": ["127.0.0.1"], "eth0": ["10.0.0.2"], "docker0": ["172.17.0.1"]},
            },
            {"a": "10.0.0.1", "b": "10.0.0.2"},
            "=eth0",
        ),
        (
            {
                "a": {"eth0": ["10.0.0.1"], "ib0": ["192.168.0.1"]},
                "b": {"eth0": ["10.0.0.2"], "ib0": ["192.168.0.2"]},
            },
            {"a": "192.168.0.1", "b": "192.168.0.2"},
            "=ib0",
        ),
        ({"a": {"eth0": ["10.0.0.1"]}, "b": {"ens5": ["10.0.0.2"]}}, {}, None),
        ({"a": {"lo": ["127.0.0.1"], "docker0": ["172.17.0.1"]}}, {}, None),
    ],
)
def test_socket_ifname_proposal(ifs, addrs, expected):
    assert ncclenv.propose_socket_ifname(ifs, addrs)[0] == expected


def test_node_env_order_and_override():
    v = {
        "nccl_home": "/opt/nccl/",
        "aws_ofi_nccl_home": "/opt/amazon/ofi-nccl",
        "libfabric_home": None,
        "nccl_env": {"NCCL_DEBUG": "WARN"},
        "nccl_propose_socket_ifname": True,
    }
    assert ncclenv.node_env(v, "=eth0") == {
        "LD_LIBRARY_PATH": "/opt/amazon/ofi-nccl/lib:/opt/nccl/lib",
        "NCCL_DEBUG": "WARN",
        "NCCL_SOCKET_IFNAME": "=eth0",
    }
    v["nccl_env"] = {"NCCL_SOCKET_IFNAME": "^lo,docker0"}
    assert ncclenv.node_env(v, "=eth0")["NCCL_SOCKET_IFNAME"] == "^lo,docker0"


def test_role_selection_keeps_site_order_and_rejects_unknown():
    assert [r.name for r in roles.load("deepspeed_env,ssh_keys", ROLES)] == [
        "ssh_keys",
        "deepspeed_env",
    ]
    with pytest.raises(InputError, match="unknown role 'sshkeys'"):
        roles.load("sshkeys", ROLES)


def test_set_values_are_yaml():
    assert parse_sets(["a=true", "b=2", "c={X: 1}", "d=text"]) == {
        "a": True,
        "b": 2,
        "c": {"X": 1},
        "d": "text",
    }
    with pytest.raises(InputError, match="expected KEY=VALUE"):
        parse_sets(["novalue"])


def _role(name):
    return roles.load(name, ROLES)[0].module


@pytest.mark.parametrize(
    "configured,current,want",
    [
        (None, "/bin/tcsh", "/bin/bash"),
        (None, "/usr/bin/fish", "/bin/bash"),
        (None, "/usr/bin/zsh", "/usr/bin/zsh"),
        (None, "/bin/bash", "/bin/bash"),
        ("/usr/bin/zsh", "/bin/bash", "/usr/bin/zsh"),
    ],
)
def test_login_shell_choice(configured, current, want):
    assert _role("shell").want_shell({"login_shell": configured}, current) == want


def test_deepspeed_env_is_bare_key_value_lines():
    text = _role("deepspeed_env").content({"LD_LIBRARY_PATH": "/a/lib", "HF_HOME": "/x y"})
    assert text == "LD_LIBRARY_PATH=/a/lib\nHF_HOME=/x y\n"
    for line in text.splitlines():  # what DeepSpeed's runner does with every line
        key, val = line.split("=", 1)
        assert key.isidentifier() and not key.startswith("export")


def test_nccl_env_block_quotes_and_keeps_node_ld_path():
    block = _role("nccl").env_block({"LD_LIBRARY_PATH": "/opt/a b/lib", "NCCL_DEBUG": "INFO;rm"})
    out = subprocess.run(
        ["/bin/sh", "-c", block + 'echo "$LD_LIBRARY_PATH|$NCCL_DEBUG"'],
        env={"LD_LIBRARY_PATH": "/usr/local/cuda/lib64"},
        capture_output=True,
        text=True,
    ).stdout
    assert out == "/opt/a b/lib:/usr/local/cuda/lib64|INFO;rm\n"


def test_two_blocks_in_one_new_file_in_one_batch(tmp_path):
    """Two roles' blocks in the same (missing) file, applied in one batch: the second action is
    planned on top of the first, so both blocks end up in the file."""
    from nodeprep.commands.waves import apply_script
    from nodeprep.engine.facts import FactValues

    path = str(tmp_path / "env.sh")
    a, b = (
        steps.FileBlock(path, "nccl", "export A=1\n"),
        steps.FileBlock(path, "venv", "export B=2\n"),
    )
    facts = FactValues(
        {f"file:{path}": {"exists": False, "mode": None, "size": 0, "content": None}}
    )
    view, changes = FactValues(facts), []
    for st in (a, b):
        changes.append((st, steps.action_for(st, view)))
        view.update(st.after(view))
    script = apply_script(changes, [], "tok")
    subprocess.run(["/bin/sh", "-c", script], check=True, capture_output=True)
    text = (tmp_path / "env.sh").read_text()
    assert "export A=1" in text and "export B=2" in text
    new = {f"file:{path}": {"exists": True, "mode": 0o644, "size": len(text), "content": text}}
    assert a.check(new).ok and b.check(new).ok
