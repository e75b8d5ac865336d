"""The wheel relay's chains (which node feeds which: per platform, from a holder or the
controller, in inventory order), its fallback decisions, the scripts' security properties
(pinned keys only, values quoted), and the engine's apply passes around fleet-level work."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from nodeprep.commands.waves import _fleet_work, _passes
from nodeprep.engine.steps import Step, StepCheck
from nodeprep.ops.pystack import relay, relay_run
from nodeprep.ops.pystack.relay import Chain, MeshLogin, Want, chains_for

X86, ARM = "cp311-x86_64-glibc2.36", "cp311-aarch64-glibc2.36"
ORDER = [f"n{i}" for i in range(8)]


def want(node, platform=X86, missing=("a.whl", "b.whl")):
    return Want(node, platform, f"/home/u/{node}/wh", tuple(missing))


def test_one_chain_per_platform_in_inventory_order_from_the_controller():
    chains = chains_for(
        [want("n3"), want("n1", ARM), want("n0"), want("n2", ARM), want("n5")], {}, ORDER
    )
    assert chains == [
        Chain(ARM, None, ["n1", "n2"], ["a.whl", "b.whl"]),
        Chain(X86, None, ["n0", "n3", "n5"], ["a.whl", "b.whl"]),
    ]


def test_a_holder_of_the_platform_heads_its_chain_not_another_platforms():
    chains = chains_for(
        [want("n1"), want("n2"), want("n4", ARM)], {X86: ["n0", "n3"], ARM: []}, ORDER
    )
    assert [(c.platform, c.source, c.nodes) for c in chains] == [
        (ARM, None, ["n4"]),
        (X86, "n0", ["n1", "n2"]),
    ]


def test_the_stream_carries_what_any_node_lacks_and_skips_nodes_lacking_nothing():
    chains = chains_for(
        [
            want("n0", missing=("b.whl",)),
            want("n1", missing=("a.whl", "c.whl")),
            want("n2", missing=()),
        ],
        {},
        ORDER,
    )
    assert chains == [Chain(X86, None, ["n0", "n1"], ["a.whl", "b.whl", "c.whl"])]


def test_no_wants_no_chain():
    assert chains_for([], {X86: ["n0"]}, ORDER) == []


def test_a_node_never_feeds_itself():
    assert chains_for([want("n0")], {X86: ["n0"]}, ORDER)[0].source is None


@pytest.mark.parametrize(
    "verified,bad,error,push,why",
    [
        ({"a.whl", "b.whl"}, set(), None, [], ""),
        ({"a.whl"}, {"b.whl"}, None, ["b.whl"], "sha256 mismatch on 1 relayed wheel(s)"),
        (
            set(),
            set(),
            "relay exit 255: Host key verification failed.",
            ["a.whl", "b.whl"],
            "2 wheel(s) not received by relay (relay exit 255: Host key verification failed.)",
        ),
        ({"b.whl"}, set(), None, ["a.whl"], "1 wheel(s) not received by relay"),
    ],
)
def test_fallback_decisions(verified, bad, error, push, why):
    assert relay.fallback(["a.whl", "b.whl"], verified, bad, error) == (push, why)


HOSTILE = MeshLogin("10.0.0.1; touch /tmp/pwned", 2222, "u$(id)")


def test_hops_log_in_with_pinned_keys_only_and_quote_inventory_values():
    text = relay.hop_script("n0", "/home/u/it's here/wh", ("n1", HOSTILE), "abc", 60)
    assert "StrictHostKeyChecking=yes" in text and "BatchMode=yes" in text
    assert "StrictHostKeyChecking=no" not in text and "KnownHostsFile=/dev/null" not in text
    assert '-o ControlMaster=no -S "$HOME/.nodeprep/relay-abc.sock"' in text  # the master's
    assert "UserKnownHostsFile" not in text  # the mesh's known_hosts
    assert shlex.quote(HOSTILE.address) in text and shlex.quote(HOSTILE.user) in text
    assert shlex.quote("/home/u/it's here/wh/.relay") in text
    subprocess.run(["sh", "-n"], input=text, text=True, check=True)  # it parses


def test_the_master_connection_is_pinned_quoted_and_never_holds_the_controller():
    text = relay.master_command(HOSTILE, "abc", 60)
    assert (
        "StrictHostKeyChecking=yes" in text
        and "BatchMode=yes" in text
        and "UserKnownHostsFile" not in text
    )
    assert shlex.quote(HOSTILE.address) in text and shlex.quote(HOSTILE.user) in text
    assert "ControlMaster=yes" in text and "ControlPersist=60" in text
    assert text.endswith("</dev/null >/dev/null 2>&1 || true")  # backgrounded, no output held
    subprocess.run(["sh", "-n"], input=text, text=True, check=True)


def test_last_hop_only_stores_and_source_streams_its_copy():
    last = relay.hop_script("n2", "/wh", None, "abc", 60)
    assert "ssh" not in last and "tar -xf - -C /wh/.relay" in last
    src = relay.source_script(
        "/wh", ["a b.whl", "c.whl"], ("n1", MeshLogin("10.0.0.2", 22, None)), "abc", 60
    )
    assert "tar -cf - -- 'a b.whl' c.whl |" in src and " -l " not in src
    subprocess.run(["sh", "-n"], input=src, text=True, check=True)


def test_finalize_moves_only_files_with_the_controllers_sum(tmp_path):
    d = tmp_path / "wh"
    (d / ".relay").mkdir(parents=True)
    (d / ".relay" / "good.whl").write_bytes(b"good")
    (d / ".relay" / "bad.whl").write_bytes(b"spoiled")
    import hashlib

    sums = {
        n: hashlib.sha256(n.split(".")[0].encode()).hexdigest()
        for n in ("good.whl", "bad.whl", "gone.whl")
    }
    (tmp_path / ".nodeprep").mkdir()
    (tmp_path / ".nodeprep" / "relay-abc.sh").write_text("left by a chain that broke")
    out = subprocess.run(
        ["sh"],
        input=relay.finalize_script(str(d), sums),
        text=True,
        capture_output=True,
        check=True,
        env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
    ).stdout
    assert relay.parse_finalize(out) == ({"good.whl"}, {"bad.whl"})
    assert sorted(p.name for p in d.iterdir()) == ["good.whl"]  # .relay gone, bad one too
    assert not (tmp_path / ".nodeprep" / "relay-abc.sh").exists()


def test_timeout_grows_with_size_and_hops():
    assert (
        relay_run.timeout_for(0, 1)
        < relay_run.timeout_for(10**9, 1)
        < relay_run.timeout_for(10**9, 32)
    )


# -- the engine's passes -------------------------------------------------------------------


def st(name, fleet=None):
    s = Step(name, [], lambda f: StepCheck(False), action="true", fleet=fleet)
    s.role = "r"
    return s


def test_steps_from_a_fleet_step_on_go_to_a_later_pass():
    work = ("relay", lambda fleet, nodes: None)
    mesh, wheel, venv = st("mesh"), st("wheel", work), st("venv")
    c = StepCheck(False)
    differ = {
        "a": [(mesh, c), (wheel, c), (venv, c)],
        "b": [(wheel, c), (venv, c)],
        "c": [(mesh, c)],
    }
    passes = _passes(differ)
    assert [{n: [s.name for s, _ in items] for n, items in p.items()} for p in passes] == [
        {"a": ["mesh"], "c": ["mesh"]},
        {"a": ["wheel", "venv"], "b": ["wheel", "venv"]},
    ]


def test_a_wave_without_fleet_steps_is_one_pass():
    c = StepCheck(False)
    assert len(_passes({"a": [(st("x"), c)], "b": [(st("y"), c)]})) == 1
    assert _passes({}) == [{}]


class _Result:
    def __init__(self):
        self.steps = []

    def add_step(self, r, *_):
        self.steps.append(r)


class _Session:
    def __init__(self, name):
        self.name, self.result = name, _Result()


class _Fleet:
    def __init__(self, names, failed=()):
        self.sessions = {n: _Session(n) for n in names}
        self.failed = set(failed)

    def usable(self):
        return [s for n, s in self.sessions.items() if n not in self.failed]


def test_fleet_work_runs_once_per_key_over_usable_nodes_and_skips_failed_ones():
    calls = []
    work = ("relay", lambda fleet, nodes: calls.append(sorted(nodes)))
    c = StepCheck(False)
    part = {n: [(st("wheel", work), c), (st("venv"), c)] for n in ("a", "b", "c")}
    fleet = _Fleet(["a", "b", "c"], failed={"b"})
    left = _fleet_work(fleet, part)
    assert calls == [["a", "c"]] and sorted(left) == ["a", "c"]
    assert [(r.status, r.name) for r in fleet.sessions["b"].result.steps] == [
        ("skipped", "r: wheel"),
        ("skipped", "r: venv"),
    ]


def test_sbcast_unpack_script_for_real_with_a_hostile_path(tmp_path):
    """wheelcast.unpack_script: the tar the head sbcast lands in <dest>/.relay (replacing
    what an earlier try left), every value quoted (a path with a quote and a $ in it)."""
    import subprocess
    import tarfile

    from nodeprep.ops.pystack import wheelcast

    src = tmp_path / "src"
    src.mkdir()
    (src / "a-1.0-py3-none-any.whl").write_bytes(b"wheel")
    tarball = tmp_path / "w.tar"
    with tarfile.open(tarball, "w") as t:
        t.add(src / "a-1.0-py3-none-any.whl", arcname="a-1.0-py3-none-any.whl")
    dest = tmp_path / "wheel house'$(touch pwned)"
    (dest / ".relay").mkdir(parents=True)
    (dest / ".relay" / "stale.whl").write_bytes(b"old")
    subprocess.run(
        ["sh", "-c", wheelcast.unpack_script(str(tarball), str(dest))], check=True, cwd=tmp_path
    )
    assert sorted(p.name for p in (dest / ".relay").iterdir()) == ["a-1.0-py3-none-any.whl"]
    assert not (tmp_path / "pwned").exists()
