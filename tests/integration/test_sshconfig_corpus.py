"""`--inventory sshconfig:` against OpenSSH itself, over real published client configs
(tests/sshconfigs/, each case names its source): for every case installed as the user's real
~/.ssh (OpenSSH finds ~/.ssh/config through the passwd home; every byte of the real ~/.ssh is
put back afterwards, also on Ctrl-C), every concrete alias is listed, and its address, port,
user, first identity file and jump equal what `ssh -G ALIAS` says. A config ssh rejects is
refused by nodeprep too, in one line naming file:line.

The listing is judged independently of nodeprep's own lexer: `ssh -G -v` names every file it
reads; every literal name on a `Host` line of those files must be listed, and every listed
name must stand on a `Host` line of the case (a plain regex reads them here)."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from nodeprep.errors import InputError
from nodeprep.inventory import load, openssh

CORPUS = Path(__file__).resolve().parents[1] / "sshconfigs"
CASES = sorted(p for p in CORPUS.iterdir() if (p / "config").is_file())
HOME = Path(pwd.getpwuid(os.getuid()).pw_dir)
SSH_DIR = HOME / ".ssh"
# ssh rejects these configs (SOURCE says why): nodeprep must refuse them in one line
REJECTED = {
    "github_docs_usekeychain_macos": "IgnoreUnknown UseKeychain",
    "dotfiles_0xmachos_usekeychain_no_ignoreunknown": "IgnoreUnknown UseKeychain",
}


def test_the_corpus_is_big_enough_and_sourced():
    assert len(CASES) >= 20
    assert all((c / "SOURCE").is_file() and (c / "SOURCE").read_text().strip() for c in CASES)


@pytest.fixture
def real_ssh_dir(monkeypatch):
    """Install a case as the real ~/.ssh; put every byte (and mode) back afterwards."""
    backup = Path(tempfile.mkdtemp(prefix="nodeprep-ssh-backup-"))
    had = SSH_DIR.exists()
    if had:
        shutil.copytree(SSH_DIR, backup / "ssh", symlinks=True)
    monkeypatch.setenv("HOME", str(HOME))  # glob's ~ in Include: as ssh sees it
    monkeypatch.setenv("XDG_RUNTIME_DIR", os.environ.get("XDG_RUNTIME_DIR") or "/run/user/0")

    def install(case: Path) -> None:
        shutil.rmtree(SSH_DIR, ignore_errors=True)
        shutil.copytree(case, SSH_DIR, ignore=shutil.ignore_patterns("SOURCE"))
        SSH_DIR.chmod(0o700)
        for p in SSH_DIR.rglob("*"):
            p.chmod(0o700 if p.is_dir() else 0o600)

    try:
        yield install
    finally:
        shutil.rmtree(SSH_DIR, ignore_errors=True)
        if had:
            shutil.copytree(backup / "ssh", SSH_DIR, symlinks=True)
        shutil.rmtree(backup, ignore_errors=True)


def ssh_g(name: str, verbose: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ssh", "-G"] + (["-v"] if verbose else []) + ["--", name],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
        errors="replace",
    )


_HOST_LINE = re.compile(r"^\s*host(?:\s*=\s*|\s+)(.*)$", re.IGNORECASE)


def host_names(path: Path) -> list[str]:
    """Literal names on `Host` lines, read plainly (not with nodeprep's lexer)."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        m = _HOST_LINE.match(line)
        if not m:
            continue
        for word in m.group(1).split():
            if word.startswith("#"):
                break
            word = word.strip('"')
            if word and not any(c in word for c in "*?") and not word.startswith("!"):
                out.append(word)
    return out


def files_read(names: list[str]) -> set[Path]:
    """The user's files ssh reads while resolving NAMES (system config left out)."""
    found = set()
    for name in names or ["nodeprep-corpus-probe"]:
        for line in ssh_g(name, verbose=True).stderr.splitlines():
            if line.startswith("debug1: Reading configuration data "):
                p = Path(line.split("Reading configuration data ", 1)[1].strip())
                if SSH_DIR in p.parents:
                    found.add(p)
    return found


def ours(spec: str = "sshconfig:"):
    """{name: host} as nodeprep reads the installed config, or the InputError."""
    try:
        inv = load(spec)
    except InputError as err:
        return err
    return {h.name: h for h in inv.hosts}


def identity(r: openssh.Resolved, host) -> bool:
    """nodeprep's key is ssh's first identity file (tokens expanded) when the config names
    one, and none when ssh falls back to its defaults."""
    defaults = openssh.default_identities()
    if r.identity_files == defaults:
        return host.key is None
    expanded = [
        openssh.identity_path(v, r, pwd.getpwuid(os.getuid()).pw_name, HOME)
        for v in r.identity_files
    ]
    return host.key == next((p for p in expanded if Path(p).is_file()), expanded[0])


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_every_alias_as_ssh_resolves_it(case, real_ssh_dir):
    real_ssh_dir(case)
    got = ours()
    if case.name in REJECTED:
        assert isinstance(got, InputError), got
        assert REJECTED[case.name] in str(got) and re.search(
            r"config:\d+: ", str(got).splitlines()[0]
        )
        assert ssh_g("anything").returncode != 0
        return
    if isinstance(got, InputError):
        names = {n for f in SSH_DIR.rglob("*") if f.is_file() for n in host_names(f)}
        if "no Host entry" in str(got):
            assert names == set(), (
                f"refused, but the case names hosts: {sorted(names)}"
            )  # patterns only
        else:  # nodeprep refuses what ssh refuses for some alias
            assert [n for n in names if ssh_g(n).returncode != 0], (
                f"nodeprep refused a config ssh reads: {got}"
            )
        return
    listed = set(got)
    expected = {n for f in files_read(list(got)) for n in host_names(f)}
    assert expected <= listed, f"not listed: {sorted(expected - listed)}"
    anywhere = {n for f in SSH_DIR.rglob("*") if f.is_file() for n in host_names(f)}
    assert listed <= anywhere, f"listed, but on no Host line: {sorted(listed - anywhere)}"
    for name, host in got.items():
        r = ssh_g(name)
        assert r.returncode == 0, r.stderr
        want = openssh.parse(name, r.stdout)
        assert (host.address, host.port, host.user) == (want.hostname, want.port, want.user), name
        assert identity(want, host), (name, host.key, want.identity_files)
        assert host.extra.get("proxyjump") == want.proxyjump, name
        assert host.extra.get("proxycommand") == want.proxycommand, name
