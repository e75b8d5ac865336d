"""container_image and the other container variables: what is read as what, and what is
refused with which reason (ops/container/image.py, spec.py). The registry grammar is
distribution/reference's (reference.go), which Docker and Podman both read."""

from __future__ import annotations

import pytest

from nodeprep.ops.container import image, spec

REGISTRY = [
    ("nvcr.io/nvidia/pytorch:24.05-py3", "nvcr.io/nvidia/pytorch:24.05-py3", ""),
    (
        "pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime",
        "docker.io/pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime",
        "",
    ),
    ("ubuntu", "docker.io/library/ubuntu", ""),
    ("localhost:5000/np/base:1", "localhost:5000/np/base:1", ""),
    ("10.200.0.1:5000/np/base", "10.200.0.1:5000/np/base", ""),
    ("ghcr.io/a__b/c-d.e_f:v1.2", "ghcr.io/a__b/c-d.e_f:v1.2", ""),
    (
        "registry.example.com/train@sha256:" + "a" * 64,
        "registry.example.com/train@sha256:" + "a" * 64,
        "sha256:" + "a" * 64,
    ),
    ("[fd00::1]:5000/np/base:2", "[fd00::1]:5000/np/base:2", ""),
]


@pytest.mark.parametrize("text,qualified,digest", REGISTRY)
def test_registry_references_are_read_as_docker_reads_them(text, qualified, digest):
    img, why = image.parse(text)
    assert why == "" and img.kind == "registry" and not img.archive
    assert img.qualified == qualified and img.digest == digest


ARCHIVES = [
    ("/srv/images/train.tar", "archive", "/srv/images/train.tar"),
    ("./train.tar", "archive", "./train.tar"),
    ("~/images/train.tar.gz", "archive", "~/images/train.tar.gz"),
    ("docker-archive:/srv/train.tar", "docker-archive", "/srv/train.tar"),
    ("oci-archive:train.tar", "oci-archive", "train.tar"),
    ("oci:/srv/layout", "oci", "/srv/layout"),
]


@pytest.mark.parametrize("text,kind,path", ARCHIVES)
def test_archives_are_read_as_paths(text, kind, path):
    img, why = image.parse(text)
    assert why == "" and img.archive and img.kind == kind and img.path == path


REFUSED = [
    ("", "empty"),
    ("  nvcr.io/x ", "spaces"),
    ("NVIDIA/PyTorch", "not an image name"),
    ("nvcr.io/nvidia/pytorch:", "tag"),
    ("nvcr.io/nvidia/pytorch:" + "x" * 129, "tag"),
    ("nvcr.io/x@sha256:abc", "sha256"),
    ("nvcr.io/x@md5", "digest"),
    ("nvcr.io/a//b", "not an image name"),
    ("a/-b", "not an image name"),
    ("bad_host_:5000/x", "not a host"),
    ("docker-archive:", "names no path"),
    ("x/" * 130 + "y", "longer than 255"),
]


@pytest.mark.parametrize("text,reason", REFUSED)
def test_what_no_engine_would_read_is_refused_with_a_reason(text, reason):
    img, why = image.parse(text)
    assert img is None and reason in why


def test_the_venv_way_has_no_spec():
    assert spec.from_vars({"container_image": None}) is None
    assert spec.from_vars({"container_image": ""}) is None


def test_a_full_spec():
    s = spec.from_vars(
        {
            "container_image": "/srv/train.tar",
            "container_engine": "podman",
            "container_fetch": "relay",
            "container_mounts": ["/data:/data:ro", "/scratch:/scratch"],
            "container_env": {"HF_HOME": "/data/hf", "OMP_NUM_THREADS": 4, "X": True},
        }
    )
    assert s.image.path == "/srv/train.tar" and s.engine == "podman"
    assert s.mounts == (spec.Mount("/data", "/data", True), spec.Mount("/scratch", "/scratch"))
    assert s.env == (("HF_HOME", "/data/hf"), ("OMP_NUM_THREADS", "4"), ("X", "1"))


BAD_VARS = [
    ({"container_image": "Bad Name"}, "container_image"),
    ({"container_engine": "singularity"}, "container_engine"),
    ({"container_fetch": "torrent"}, "container_fetch"),
    ({"container_fetch": "registry"}, "container_fetch"),  # an archive has no registry
    ({"container_mounts": ["data:/data"]}, "container_mounts"),
    ({"container_mounts": ["/a:/b:rx"]}, "container_mounts"),
    ({"container_mounts": ["/a b:/b"]}, "container_mounts"),
    ({"container_mounts": ["/a:/b:ro:x"]}, "container_mounts"),
    ({"container_mounts": [{"src": "/a"}]}, "container_mounts"),
    ({"container_env": {"1X": "a"}}, "container_env"),
    ({"container_env": {"A-B": "a"}}, "container_env"),
    ({"container_env": {"A": ["x"]}}, "container_env"),
]


@pytest.mark.parametrize("override,var", BAD_VARS)
def test_each_bad_value_names_its_variable(override, var):
    v = {
        "container_image": "/srv/train.tar",
        "container_engine": "auto",
        "container_fetch": "relay",
    }
    v.update(override)
    with pytest.raises(spec.Refused) as e:
        spec.from_vars(v)
    assert e.value.var == var and str(e.value)
