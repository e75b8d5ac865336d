"""A registry reference pinned on the controller (ops/container/registry.py), on manifests
recorded from the lab's real registry (tests/recordings/registry/README.md): a plain manifest,
and podman's OCI index over two architectures. skopeo itself is replaced by the recordings;
the lab tests run the real one (tests/integration/test_containers.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from nodeprep.ops.container import registry

REC = Path(__file__).resolve().parents[1] / "recordings" / "registry"
SINGLE = (REC / "manifest-amd64.json").read_bytes()
ARM = (REC / "manifest-arm64.json").read_bytes()
INDEX = (REC / "index-amd64-arm64.json").read_bytes()
CONFIG = (REC / "config-amd64.json").read_bytes()
ID = "sha256:86148f858b27e9761e13d0a188c508014d4f5d1f0220c51c7843ad6a3d0830d6"
REPO = "10.193.0.1:5000/team/np-lab"


def registry_of(blobs: dict[str, bytes], configs: dict[str, bytes] | None = None):
    """A stand-in skopeo answering `inspect --raw docker://REF` from BLOBS and `inspect
    --config --raw docker://REPO@DIGEST` from CONFIGS (the recorded amd64 config for any),
    calls counted."""
    calls = []

    def run(argv, ref, timeout=0):
        calls.append(argv[-1])
        if argv[:4] == ["skopeo", "inspect", "--config", "--raw"]:
            return (configs or {}).get(argv[4].removeprefix("docker://"), CONFIG)
        assert argv[:3] == ["skopeo", "inspect", "--raw"], argv
        return blobs[argv[3].removeprefix("docker://")]

    return run, calls


def test_a_plain_manifest_is_pinned_by_its_own_digest_in_one_request():
    run, calls = registry_of({f"{REPO}:1": SINGLE})
    pin = registry.resolve(f"{REPO}:1", "amd64", run)
    assert pin.id == ID and pin.digest == "sha256:" + hashlib.sha256(SINGLE).hexdigest()
    assert pin.pull == f"{REPO}@{pin.digest}" and pin.tags == (f"{REPO}:1",)
    assert pin.size == 85438877 and len(calls) == 2  # the manifest, then its config


def test_an_index_gives_each_architecture_its_own_manifest():
    amd = "sha256:751f8cc3ab6e73bd34c5431a4aba8fb29b31943ce932713ea691f7ee81e3a6a0"
    arm = "sha256:bb2aa3ec8480ec629d5b475f12355efeb55b419a7b9256c0bf7b06380cb21b2d"
    run, calls = registry_of(
        {f"{REPO}:multi": INDEX, f"{REPO}@{amd}": SINGLE, f"{REPO}@{arm}": ARM}
    )
    x86 = registry.resolve(f"{REPO}:multi", registry.arch_of("x86_64"), run)
    a64 = registry.resolve(f"{REPO}:multi", registry.arch_of("aarch64"), run)
    assert (x86.digest, a64.digest) == (amd, arm) and x86.id == ID and a64.id != ID
    assert len(calls) == 4  # the index, then the platform's manifest, for each


def test_a_single_architecture_image_for_another_architecture_is_refused():
    run, _ = registry_of({f"{REPO}:1": SINGLE})
    with pytest.raises(registry.RegistryError, match=r"an image for amd64 only; the node is arm64"):
        registry.resolve(f"{REPO}:1", "arm64", run)


def test_a_reference_with_a_tag_and_a_digest_is_read_by_its_digest():
    digest = "sha256:" + hashlib.sha256(SINGLE).hexdigest()
    run, calls = registry_of({f"{REPO}@{digest}": SINGLE})
    pin = registry.resolve(f"{REPO}:1@{digest}", "amd64", run)
    assert calls[0] == f"docker://{REPO}@{digest}" and pin.digest == digest and pin.tags == ()


def test_an_index_without_the_nodes_architecture_names_what_it_has():
    run, _ = registry_of({f"{REPO}:multi": INDEX})
    with pytest.raises(
        registry.RegistryError, match=r"no image for ppc64le \(it has: amd64, arm64\)"
    ):
        registry.resolve(f"{REPO}:multi", "ppc64le", run)


def test_a_reference_by_digest_names_no_tag_and_keeps_its_repository():
    ref = f"{REPO}@sha256:" + "a" * 64
    assert registry.repo_of(ref) == REPO and registry.repo_of(f"{REPO}:1") == REPO
    assert registry.repo_of("localhost:5000/x") == "localhost:5000/x"
    run, _ = registry_of({ref: SINGLE})
    assert registry.resolve(ref, "amd64", run).tags == ()


@pytest.mark.parametrize(
    "raw, why",
    [
        (b"<html>", "not JSON"),
        (b"[1]", "not a JSON object"),
        (b'{"schemaVersion": 1, "fsLayers": []}', "names no config"),
    ],
)
def test_what_is_no_manifest_is_one_line(raw, why):
    run, _ = registry_of({f"{REPO}:1": raw})
    with pytest.raises(registry.RegistryError, match=why):
        registry.resolve(f"{REPO}:1", "amd64", run)


def test_skopeo_missing_or_failing_is_one_line_with_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(registry.RegistryError) as e:
        registry.skopeo(["skopeo", "inspect", "--raw", "docker://x/y:1"], "x/y:1")
    assert "skopeo is not installed" in e.value.message and "apt-get install skopeo" in e.value.hint
    fake = tmp_path / "skopeo"  # a skopeo that fails as the real one does: its last line
    fake.write_text(
        '#!/bin/sh\necho "$@" > "$0.args"\n'
        "echo 'level=fatal msg=\"manifest unknown\"' >&2\nexit 1\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("CONTAINERS_REGISTRIES_CONF", "/etc/site/registries.conf")
    with pytest.raises(
        registry.RegistryError, match='skopeo inspect failed: level=fatal msg="manifest unknown"'
    ):
        registry.skopeo(["skopeo", "inspect", "--raw", "docker://x/y:1"], "x/y:1")
    args = (tmp_path / "skopeo.args").read_text().split()
    assert args[:2] == ["--registries-conf", "/etc/site/registries.conf"]


def test_the_pin_each_node_got_is_recalled(tmp_path):
    run, _ = registry_of({f"{REPO}:1": SINGLE})
    pin = registry.resolve(f"{REPO}:1", "amd64", run)
    registry.remember(tmp_path, {"worker-0": pin})
    assert registry.recall(tmp_path, f"{REPO}:1", "worker-0") == pin
    assert registry.recall(tmp_path, f"{REPO}:1", "worker-1") is None
    (tmp_path / "images" / registry.PINS).write_text("{not json")
    assert registry.recall(tmp_path, f"{REPO}:1", "worker-0") is None
