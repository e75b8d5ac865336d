"""Whether a node can run the image, decided from its CONTAINER fact as recorded on real
engines (tests/facts/container/: podman 4.3.1 on the lab, the Docker 28.2.2 CLI refused by a
daemon that is not there or a socket the user may not open)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from nodeprep.ops.container import readiness

CASES = Path(__file__).parents[1] / "facts" / "container"


def fact(name: str) -> dict:
    return json.loads((CASES / f"{name}.json").read_text())["expected"]


def test_rootless_podman_with_subids_is_ready():
    r = readiness.assess(fact("podman_fresh"), "auto", 0, "nodeprep")
    assert r.ok and r.engine == "podman" and not r.sudo and r.version == "4.3.1"
    assert r.command() == ["podman"]


@pytest.mark.parametrize(
    "case,wanted,code,words",
    [
        ("no_engine", "auto", "CONTAINER_NO_ENGINE", "apt-get install podman"),
        ("podman_fresh", "docker", "CONTAINER_NO_ENGINE", "docker.io"),
        ("docker_no_daemon", "auto", "CONTAINER_DAEMON_DOWN", "systemctl enable --now docker"),
        ("docker_denied", "docker", "CONTAINER_NOT_ALLOWED", "usermod -aG docker jdoe"),
        ("podman_no_subids", "auto", "CONTAINER_NO_SUBIDS", "--add-subuids"),
    ],
)
def test_each_missing_piece_is_named_with_its_fix(case, wanted, code, words):
    r = readiness.assess(fact(case), wanted, 0, "jdoe")
    assert not r.ok
    assert r.problems[0].code == code and words in r.problems[0].fix


def test_a_node_that_did_not_answer_is_unknown_not_ready():
    r = readiness.assess(None, "auto", 0, "jdoe")
    assert not r.ok and r.problems[0].code == "CONTAINER_UNKNOWN"


def test_podman_goes_first_under_auto_and_a_refused_one_is_passed_over():
    both = fact("podman_fresh")
    both["engines"].update(fact("docker_denied")["engines"])
    assert readiness.assess(both, "auto", 0, "u").engine == "podman"
    assert readiness.assess(both, "docker", 0, "u").problems[0].code == "CONTAINER_NOT_ALLOWED"


def test_sudo_only_runs_through_sudo():
    f = copy.deepcopy(fact("podman_fresh"))
    f["engines"]["podman"]["access"] = "sudo"
    r = readiness.assess(f, "podman", 0, "u")
    assert r.ok and r.command() == ["sudo", "-n", "podman"]


def test_a_gpu_node_needs_the_toolkit():
    f = fact("podman_fresh")
    r = readiness.assess(f, "auto", 8, "u")
    assert (
        r.problems[0].code == "CONTAINER_NO_GPU_TOOLKIT"
        and "nvidia-ctk cdi generate" in r.problems[0].fix
    )
    f = copy.deepcopy(f)
    f["cdi"] = ["/etc/cdi/nvidia.yaml"]
    assert readiness.assess(f, "auto", 8, "u").ok


def test_a_hung_engine_is_named():
    f = copy.deepcopy(fact("docker_no_daemon"))
    f["engines"]["docker"]["access"] = "timeout"
    assert readiness.assess(f, "docker", 0, "u").problems[0].code == "CONTAINER_ENGINE_HUNG"


# verify-parity's container keys, from the same recordings (ops/verify/fingerprints.py)
from nodeprep.engine.facts import USER  # noqa: E402
from nodeprep.engine.facts.container import CONTAINER  # noqa: E402
from nodeprep.ops.container import archive  # noqa: E402
from nodeprep.ops.verify import fingerprints  # noqa: E402

TINY = archive.read(Path(__file__).parents[1] / "recordings" / "images" / "tiny-docker.tar")
V = {"container_image": "/srv/tiny-docker.tar", "container_engine": "auto"}


def keys(case: str, image=TINY) -> dict:
    f = {CONTAINER("podman,docker"): fact(case), USER: {"name": "lab", "uid": 1000, "home": "/h"}}
    return fingerprints.with_container({}, V, f, image)


def test_parity_keys_of_a_node_that_holds_the_image():
    assert keys("podman_with_images") == {
        "container.engine": "podman 4.3.1",
        "container.image": TINY.id,
    }


def test_parity_keys_of_a_node_without_it_or_without_an_engine():
    assert keys("podman_fresh")["container.image"] == "missing"
    assert keys("no_engine") == {
        "container.engine": "CONTAINER_NO_ENGINE",
        "container.image": "missing",
    }


def test_parity_keys_name_the_other_id_held_under_the_image_name():
    other = archive.ArchiveImage(TINY.path, TINY.kind, "sha256:" + "1" * 64, "amd64", TINY.tags, 1)
    assert keys("podman_with_images", other)["container.image"] == TINY.id


def test_the_venv_way_adds_no_key():
    assert keys("podman_fresh", None) == {}


def test_the_engine_storage_too_small_for_the_image_is_named_with_its_fix():
    f = fact("podman_fresh")  # 63.7 GB free where podman keeps images (recorded)
    assert readiness.storage_short(f, "podman", 10**9) is None
    why = readiness.storage_short(f, "podman", 80 * 10**9)
    assert "63.7 GB free" in why and "80.0 GB" in why and "podman system prune" in why
    assert readiness.storage_short(fact("no_engine"), "podman", 10**12) is None  # not seen


def test_parity_keys_of_the_python_stack_inside_the_image():
    """IMAGE_STACK as recorded on the lab's training image: the venv's keys' counterparts, so
    a node whose image holds another numpy is DRIFT on container.pkg.numpy."""
    from nodeprep.engine.facts.python import IMAGE_STACK

    stack = json.loads((CASES.parent / "image_stack" / "train_image.json").read_text())
    f = {
        CONTAINER("podman,docker"): fact("podman_with_images"),
        USER: {"name": "lab", "uid": 1000, "home": "/h"},
        IMAGE_STACK(TINY.id): stack["expected"],
    }
    fp = fingerprints.with_container({}, V, f, TINY)
    assert fp["container.python"] == "3.11.2"
    assert fp["container.torch.version"] == "2.13.0+cpu" and fp["container.torch.cuda"] is None
    assert fp["container.pkg.numpy"] == "2.4.6" and fp["container.pkg.deepspeed"] == "0.19.8"
    other = copy.deepcopy(stack["expected"])
    other["packages"]["numpy"] = "2.3.0"
    f[IMAGE_STACK(TINY.id)] = other
    drift = fingerprints.with_container({}, V, f, TINY)
    assert {k for k in fp if fp[k] != drift.get(k)} == {"container.pkg.numpy"}
