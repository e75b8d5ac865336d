"""engine/remote.SHA256_SH: the node-side sha256 the wheel checks use (openssl's, which uses
the CPU's SHA instructions, when it answers right; sha256sum otherwise) gives the true digest
in every case, run by a real dash."""

import hashlib
import os
import shutil
import subprocess

import pytest

from nodeprep.engine.remote import SHA256_SH

DASH = shutil.which("dash")


def digest_by_sh(path, env=None):
    r = subprocess.run(
        [DASH, "-c", f'{SHA256_SH}; np_sha256 < "$1"; echo "$np_shc"', "sh", str(path)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


@pytest.mark.parametrize("size", [0, 1, 65_537, 3_000_001])
def test_it_is_the_true_sha256_of_the_file(tmp_path, size):
    f = tmp_path / "w.whl"
    f.write_bytes(os.urandom(size))
    digest, how = digest_by_sh(f)
    assert digest == hashlib.sha256(f.read_bytes()).hexdigest()
    assert how == "openssl"  # this machine has a working openssl


def shadowed_path(tmp_path, openssl_body):
    """A PATH whose openssl is OPENSSL_BODY (None: no openssl at all) and the rest the system's."""
    b = tmp_path / "bin"
    b.mkdir()
    for tool in ("sha256sum", "cut", "printf"):
        src = subprocess.run(
            ["sh", "-c", f"command -v {tool}"], capture_output=True, text=True
        ).stdout.strip()
        if src.startswith("/"):
            (b / tool).symlink_to(src)
    if openssl_body is not None:
        (b / "openssl").write_text(f"#!/bin/sh\n{openssl_body}\n")
        (b / "openssl").chmod(0o755)
    return dict(os.environ, PATH=str(b))


@pytest.mark.parametrize(
    "openssl_body",
    [
        None,
        "echo junk",
        "exit 1",
        "cat >/dev/null; "
        "echo 0000000000000000000000000000000000000000000000000000000000000000 '*stdin'",
    ],
)
def test_a_missing_or_wrong_openssl_falls_back_to_sha256sum(tmp_path, openssl_body):
    f = tmp_path / "w.whl"
    f.write_bytes(b"wheel bytes")
    digest, how = digest_by_sh(f, shadowed_path(tmp_path, openssl_body))
    assert (digest, how) == (hashlib.sha256(b"wheel bytes").hexdigest(), "sha256sum")
