"""Reading an ssh client config as OpenSSH 9.2 reads it (inventory/sshconfig_files.py for the
names, `ssh -G` for the values): the cases ssh accepts that a hand-written reader got wrong
(comments after a word, Match with quoted lists, Include with globs and inside Host blocks,
CanonicalizeHostname without domains), and what ssh rejects, in one line with the fix.
`sshconfig:FILE` reads FILE as `ssh -F FILE` does; Include's relative paths and `~` resolve
under $HOME/.ssh, as ssh's glob resolves them (tests/integration/test_sshconfig_corpus.py
runs the user's real ~/.ssh against ssh -G)."""

from __future__ import annotations

import pytest

from nodeprep.errors import InputError
from nodeprep.inventory import load, openssh, sshconfig_files


@pytest.mark.parametrize(
    "line, expect",
    [
        ("Host pi   # my Raspberry Pi", ("host", ["pi"])),
        ("User name   # comment", ("user", ["name"])),
        ("HostName=10.0.0.1", ("hostname", ["10.0.0.1"])),
        ("HostName = 10.0.0.1", ("hostname", ["10.0.0.1"])),
        ("  host a b#c  \t", ("host", ["a", "b#c"])),  # '#' inside a word is no comment
        ('Match host="a,b" User x', ("match", ["host=a,b", "User", "x"])),
        ('IdentityFile "~/.ssh/my key"', ("identityfile", ["~/.ssh/my key"])),
        ("Host a\\ b 'c d'", ("host", ["a b", "c d"])),
        ("# a comment", None),
        ("   ", None),
    ],
)
def test_words_as_ssh_splits_them(line, expect):
    kw = sshconfig_files.split_keyword(line)
    assert (kw and (kw[0], sshconfig_files.arguments(kw[1]))) == expect or (
        kw is None and expect is None
    )


def test_an_unclosed_quote_is_refused():
    with pytest.raises(ValueError):
        sshconfig_files.arguments('host "x')


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A home whose .ssh the config's includes resolve into (ssh's glob uses $HOME)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir(mode=0o700)
    return tmp_path / ".ssh"


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o600)
    return path


def hosts(config) -> dict:
    return {h.name: h for h in load(f"sshconfig:{config}").hosts}


def test_include_globs_nested_and_inside_a_host_block(home):
    config = write(
        home / "config",
        "Host *\n    User everyone\n\nInclude config.d/*.conf\n"
        "Host gpu01   # the first\n    Include gpu01.extra\n",
    )
    write(
        home / "config.d" / "10-rack.conf",
        "Include ~/.ssh/deeper\nHost rack1 rack2\n    HostName 10.1.0.%h\n"
        "Include ~/.ssh/in_rack_block\n",
    )
    write(home / "in_rack_block", "Host shadow\n    HostName 10.8.8.8\n")
    write(home / "config.d" / "20-login.conf", "Host login\n    Port 2222\n")
    write(home / "config.d" / "skipped.txt", "Host never\n")
    write(home / "deeper", "Host deep\n    HostName 10.9.9.9\n")
    write(home / "gpu01.extra", "    HostName 10.0.0.1\n    User ops\n    ProxyJump bastion\n")
    got = hosts(config)
    assert list(got) == ["deep", "rack1", "rack2", "shadow", "login", "gpu01"]
    # `Host *` first: ssh takes the first value it finds, so User everyone wins everywhere
    assert {n: h.user for n, h in got.items()} == dict.fromkeys(got, "everyone")
    assert got["gpu01"].address == "10.0.0.1" and got["gpu01"].extra["proxyjump"] == "bastion"
    assert got["rack2"].address == "10.1.0.rack2" and got["login"].port == 2222
    assert got["deep"].address == "10.9.9.9"
    # included inside `Host rack1 rack2`: ssh reads it only for those, so `ssh shadow` goes
    # to the name itself (it is listed: a name of the config, with ssh's values)
    assert got["shadow"].address == "shadow"


def test_canonicalize_without_domains_changes_nothing(home):
    config = write(home / "config", "Host a\n    HostName 10.0.0.5\n    CanonicalizeHostname yes\n")
    assert hosts(config)["a"].address == "10.0.0.5"


def test_match_with_a_quoted_list_and_identity_tokens(home):
    config = write(
        home / "config",
        "Host a b\n    HostName %h.example.org\n"
        'Match host="a.example.org,c" User x\n    Port 2200\n'
        "Host *\n    IdentityFile ~/.ssh/%r_%h\n    User u\n",
    )
    got = hosts(config)
    assert got["a"].address == "a.example.org" and got["b"].port == 22
    assert got["a"].key == str(sshconfig_files.passwd_home() / ".ssh" / "u_a.example.org")


def test_what_ssh_rejects_is_one_line_with_the_fix(home):
    config = write(home / "config", "Host mac\n    UseKeychain yes\n    HostName 10.0.0.1\n")
    with pytest.raises(InputError) as err:
        hosts(config)
    text = str(err.value)
    assert text.startswith(
        f"{config}:2: ssh rejects the config: Bad configuration option: usekeychain"
    )
    assert "IgnoreUnknown UseKeychain" in text and "\n" not in text
    write(
        config, "IgnoreUnknown UseKeychain\nHost mac\n    UseKeychain yes\n    HostName 10.0.0.1\n"
    )
    assert hosts(config)["mac"].address == "10.0.0.1"


def test_a_name_the_inventory_cannot_carry_names_its_line(home):
    config = write(home / "config", "Host ok\nHost $(touch /tmp/x)gpu\n")
    with pytest.raises(InputError, match=rf"^{config}:2: host name '\$\(touch'"):
        hosts(config)


def test_only_patterns_is_refused_with_the_form_to_use(home):
    config = write(home / "config", "Host *\n    User u\nHost *.internal !x\n")
    with pytest.raises(
        InputError, match="no Host entry in the ssh config or the files it includes"
    ):
        hosts(config)


def test_identity_tokens_expand_as_ssh_expands_them():
    r = openssh.Resolved("alias", {"hostname": ["h.example"], "port": ["2200"], "user": ["ru"]})
    from pathlib import Path

    got = openssh.identity_path("~/k/%%%n-%h-%p-%r-%u-%d", r, "lu", Path("/home/lu"))
    assert got == "/home/lu/k/%alias-h.example-2200-ru-lu-/home/lu"
