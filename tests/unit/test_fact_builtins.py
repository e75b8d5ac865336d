"""The DIR and etc_shells facts list with sh builtins (no `ls`, no `cat`): run by a real dash
against real directories and files, they give what ls -1A and cat gave."""

import os
import shutil
import subprocess

from nodeprep.engine.facts.files import DIR, parse_dir
from nodeprep.engine.facts.system import ETC_SHELLS, _etc_shells

DASH = shutil.which("dash")


def sh(script: str, home) -> tuple[str, int]:
    r = subprocess.run(
        [DASH, "-c", f"( {script}\n) 2>&1 </dev/null"],
        capture_output=True,
        text=True,
        env=dict(os.environ, HOME=str(home)),
    )
    return r.stdout, r.returncode


def test_dir_lists_every_entry_dot_files_and_odd_names_included(tmp_path):
    d = tmp_path / "wheel house"
    d.mkdir()
    names = ["b.whl", "a.whl", ".sums", "..odd", ".x", "with space.whl", "-dash", "*", "[a]"]
    for n in names:
        (d / n).write_text("x")
    (d / "sub").mkdir()
    (d / "dangling").symlink_to(d / "nowhere")
    out, rc = sh(DIR.command(str(d)), tmp_path)
    assert rc == 0
    assert parse_dir(out, rc) == sorted(names + ["sub", "dangling"])
    ls = subprocess.run(["ls", "-1A", "--", str(d)], capture_output=True, text=True).stdout
    assert parse_dir(out, rc) == sorted(ls.splitlines())


def test_dir_empty_missing_and_home_relative(tmp_path):
    (tmp_path / "empty").mkdir()
    assert parse_dir(*sh(DIR.command(str(tmp_path / "empty")), tmp_path)) == []
    assert parse_dir(*sh(DIR.command(str(tmp_path / "nope")), tmp_path)) is None
    (tmp_path / ".nodeprep" / "wh").mkdir(parents=True)
    (tmp_path / ".nodeprep" / "wh" / "t.whl").write_text("")
    assert parse_dir(*sh(DIR.command("~/.nodeprep/wh"), tmp_path)) == ["t.whl"]


def test_etc_shells_reads_the_real_file_as_cat_does(tmp_path):
    out, rc = sh(ETC_SHELLS.command({}), tmp_path)
    with open("/etc/shells") as f:
        assert _etc_shells(out, rc) == _etc_shells(f.read(), 0)
    assert rc == 0 and "/bin/sh" in _etc_shells(out, rc)


def test_login_shell_reads_the_uid_without_id_and_matches_getent_of_the_user_name(tmp_path):
    """The effective uid comes from /proc/self/status by a read loop; as root and as the lab's
    user (runuser), it names the same passwd entry as `getent passwd "$(id -un)"` did."""
    import pwd

    from nodeprep.engine.facts.system import LOGIN_SHELL, _login_shell

    out, rc = sh(LOGIN_SHELL.command({}), tmp_path)
    assert rc == 0 and _login_shell(out, rc) == pwd.getpwuid(os.geteuid()).pw_shell
    runuser = shutil.which("runuser") or "/usr/sbin/runuser"
    try:
        other = pwd.getpwnam("nodeprep")
    except KeyError:
        return  # the lab user exists once `invoke lab.up` ran; root alone is checked then
    r = subprocess.run(
        [runuser, "-u", "nodeprep", "--", DASH, "-c", LOGIN_SHELL.command({})],
        capture_output=True,
        text=True,
        cwd="/",
    )
    assert r.returncode == 0 and _login_shell(r.stdout, 0) == other.pw_shell
    assert r.stdout.split(":")[0] == "nodeprep"
