"""An image archive read on the controller without an engine: the ID computed from the config's
bytes must be the one the engine shows. Oracle: podman 4.3.1's own `podman images --no-trunc`
for the image these archives were saved from (tests/recordings/images/SOURCE.md)."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from nodeprep.ops.container import archive

IMAGES = Path(__file__).parents[1] / "recordings" / "images"
PODMAN_ID = "sha256:ce7323bb61c70fd4bfb9860ba00458616d99b7de8aa9ee848318023cd7fd34ca"


@pytest.mark.parametrize(
    "name,kind",
    [
        ("tiny-docker.tar", "docker-archive"),
        ("tiny-oci.tar", "oci-archive"),
        ("tiny-oci-dir", "oci"),
    ],
)
def test_every_format_gives_the_id_podman_shows(name, kind):
    img = archive.read(IMAGES / name)
    assert (img.kind, img.id, img.arch, img.tags) == (
        kind,
        PODMAN_ID,
        "amd64",
        ("localhost/np-tiny:1",),
    )
    assert img.size > 0


def test_a_file_that_is_no_image_is_refused(tmp_path):
    plain = tmp_path / "notes.tar"
    with tarfile.open(plain, "w") as tar:
        tar.add(__file__, arcname="notes.txt")
    with pytest.raises(archive.NotAnImage, match="not an image archive"):
        archive.read(plain)
    with pytest.raises(archive.NotAnImage):
        archive.read(tmp_path / "missing.tar")


def test_a_truncated_archive_is_refused_not_a_traceback(tmp_path):
    cut = tmp_path / "cut.tar"
    cut.write_bytes((IMAGES / "tiny-docker.tar").read_bytes()[:3000])
    with pytest.raises(archive.NotAnImage):
        archive.read(cut, "docker-archive")
