import json

import pytest

from nodeprep.cli.parity_text import render
from nodeprep.errors import InputError
from nodeprep.ops.verify.parity import (
    Drift,
    Group,
    Report,
    against_baseline,
    baseline_read,
    compare,
    fingerprint_file_write,
    severity_of,
)

BASE = {
    "python.version": "3.11.9",
    "pkg.numpy": "1.26.4",
    "torch.version": "2.5.1+cu124",
    "kernel.release": "5.15.0-105-generic",
    "env.deepspeed.NCCL_DEBUG": "WARN",
}


def fleet(n=3, **changes):
    """n identical nodes; changes: worker-index -> {key: value} (None deletes the key)."""
    fps = {f"worker-{i}": dict(BASE) for i in range(n)}
    for name, diff in changes.items():
        fp = fps[name.replace("_", "-")]
        for key, value in diff.items():
            if value is None:
                fp.pop(key)
            else:
                fp[key] = value
    return fps


def verdict_of(report):
    return render(report).rstrip("\n").splitlines()[-1]


def test_identical_fleet_is_ok():
    report = compare(fleet())
    assert report.ok and report.drift == [] and report.compared_keys == 5
    assert render(report) == "PARITY OK: 3 nodes identical on 5 keys\n"


def test_one_node_differs_on_one_package():
    report = compare(fleet(worker_2={"pkg.numpy": "2.0.1"}))
    assert not report.ok
    assert report.drift == [
        Drift(
            "pkg.numpy",
            "error",
            [Group(["worker-0", "worker-1"], "1.26.4"), Group(["worker-2"], "2.0.1")],
        )
    ]
    assert render(report) == (
        "pkg.numpy\n"
        "  worker-[0-1]  1.26.4\n"
        "  worker-2      2.0.1\n"
        "DRIFT: 1 key differs on 1 of 3 nodes (pkg.numpy), odd node: worker-2\n"
    )


def test_absent_key_shown_as_dash_and_counts_as_drift():
    report = compare(fleet(worker_2={"env.deepspeed.EXTRA": "1"}, worker_1={"pkg.numpy": None}))
    text = render(report)
    assert "env.deepspeed.EXTRA\n  worker-[0-1]  -\n  worker-2      1\n" in text
    assert "pkg.numpy\n  worker-[0,2]  1.26.4\n  worker-1      -\n" in text
    assert report.as_dict()["drift"][0]["groups"][0]["value"] is None
    assert "2 keys differ on 2 of 3 nodes (env.deepspeed.EXTRA, pkg.numpy)" in verdict_of(report)


def test_strings_that_look_absent_or_alike_are_quoted():
    text = render(compare({"a1": {"k": "-"}, "a2": {}, "a3": {"k": "x "}, "a4": {"k": "x"}}))
    assert '  a1  "-"' in text and "  a2  -\n" in text
    assert '"x "' in text and '"x"' in text  # trailing space would otherwise be invisible


def test_warning_only_drift_keeps_ok():
    report = compare(fleet(worker_1={"kernel.release": "5.15.0-107-generic"}))
    assert report.ok
    assert report.drift[0].severity == "warning"
    text = render(report)
    assert "kernel.release  (warning)\n" in text
    assert verdict_of(report) == (
        "PARITY OK: 3 nodes identical on 4 of 5 keys; 1 warning (kernel.release)"
    )


def test_info_keys_are_reported_never_fail():
    fps = fleet(worker_0={"shell.login": "/bin/zsh"})
    report = compare(fps, severity={"shell": "info"})
    assert report.ok and "shell.login  (info)" in render(report)
    assert verdict_of(report).endswith("; 1 info (shell.login)")
    # the same drift with no severity map is an error
    assert not compare(fps).ok


def test_severity_longest_prefix_wins_on_dotted_parts():
    sev = {"env": "info", "env.deepspeed": "warning", "env.deepspeed.NCCL_DEBUG": "error"}
    assert severity_of("env.deepspeed.NCCL_DEBUG", sev) == "error"
    assert severity_of("env.deepspeed.EXTRA", sev) == "warning"
    assert severity_of("env.other", sev) == "info"
    assert severity_of("environment", sev) == "error"  # "env" is not a prefix of it
    assert severity_of("kernel.release") == "warning"  # built-in default
    assert severity_of("os.release") == "warning"
    assert severity_of("kernel.release", {"kernel": "error"}) == "error"
    assert severity_of("pkg.numpy") == "error"
    with pytest.raises(ValueError, match="'fatal'"):
        severity_of("pkg.numpy", {"pkg": "fatal"})


def test_unreachable_node_fails_but_the_rest_are_compared():
    fps = fleet(worker_2={"pkg.numpy": "2.0.1"})
    fps["worker-3"] = {"pkg.numpy": "9.9"}  # stale fingerprint of a node now unreachable
    report = compare(
        fps,
        unreachable={"worker-3": "ssh: connect timed out"},
        order=[f"worker-{i}" for i in range(4)],
    )
    assert not report.ok
    assert report.nodes == ["worker-0", "worker-1", "worker-2", "worker-3"]
    assert [g.nodes for g in report.drift[0].groups] == [["worker-0", "worker-1"], ["worker-2"]]
    text = render(report)
    assert "worker-3      unreachable: ssh: connect timed out\n" in text
    assert verdict_of(report).endswith("; 1 node unreachable (worker-3)")

    only_unreachable = compare(fleet(2), unreachable={"worker-2": "refused"})
    assert not only_unreachable.ok
    assert verdict_of(only_unreachable) == (
        "PARITY FAILED: 2 nodes identical on 5 keys; 1 node unreachable (worker-2)"
    )


def test_node_in_inventory_without_fingerprint_is_unreachable():
    report = compare(fleet(2), order=["worker-0", "worker-1", "worker-2"])
    assert report.unreachable == {"worker-2": "no fingerprint collected"} and not report.ok


def test_nothing_reachable_is_not_ok():
    report = compare({}, unreachable={"worker-0": "timeout", "worker-1": "timeout"})
    assert not report.ok
    assert render(report) == (
        "worker-[0-1]  unreachable: timeout\n"
        "PARITY FAILED: no node could be compared; "
        "2 nodes unreachable (worker-[0-1])\n"
    )


def test_checks():
    checks = [
        {"node": "worker-2", "key": "ssh.mesh.to", "message": "worker-0 -> worker-2 refused"},
        {
            "node": "worker-1",
            "key": "gpu.ecc",
            "message": "3 volatile errors",
            "severity": "warning",
        },
    ]
    report = compare(fleet(), checks=checks)
    assert not report.ok
    assert report.checks[0] == {
        "node": "worker-2",
        "key": "ssh.mesh.to",
        "message": "worker-0 -> worker-2 refused",
        "severity": "error",
    }
    text = render(report)
    assert "worker-2  ssh.mesh.to: worker-0 -> worker-2 refused\n" in text
    assert "worker-1  gpu.ecc: 3 volatile errors  (warning)\n" in text
    assert verdict_of(report) == (
        "PARITY FAILED: 3 nodes identical on 5 keys; 1 check failed; 1 check note"
    )
    assert compare(fleet(), checks=checks[1:]).ok


def test_identical_checks_fold_into_one_line():
    checks = [
        {"node": f"worker-{i}", "key": "ssh.mesh.to", "message": "-> worker-0 refused"}
        for i in (1, 2, 3)
    ]
    text = render(compare(fleet(4), checks=checks))
    assert "worker-[1-3]  ssh.mesh.to: -> worker-0 refused\n" in text


def test_folding_32_nodes():
    fps = fleet(32, worker_7={"torch.version": "2.5.1+cu121"})
    report = compare(fps)
    assert render(report).splitlines()[:3] == [
        "torch.version",
        "  worker-[0-6,8-31]  2.5.1+cu124",
        "  worker-7           2.5.1+cu121",
    ]
    assert verdict_of(report).endswith("1 of 32 nodes (torch.version), odd node: worker-7")
    fps = fleet(32, worker_31={"pkg.numpy": "2.0.1"}, worker_30={"pkg.numpy": "2.0.1"})
    report = compare(fps)
    assert "  worker-[0-29]  1.26.4\n  worker-[30-31]  2.0.1\n" not in render(report)
    assert "  worker-[0-29]   1.26.4\n  worker-[30-31]  2.0.1\n" in render(report)
    assert "odd nodes: worker-[30-31]" in verdict_of(report)
    assert render(compare(fleet(32))) == "PARITY OK: 32 nodes identical on 5 keys\n"


def test_unreachable_nodes_fold():
    fps = {f"worker-{i}": dict(BASE) for i in range(30)}
    report = compare(fps, unreachable={"worker-30": "timeout", "worker-31": "timeout"})
    assert "worker-[30-31]  unreachable: timeout" in render(report)


def test_no_majority_names_no_odd_node():
    report = compare(fleet(4, worker_2={"pkg.numpy": "2"}, worker_3={"pkg.numpy": "2"}))
    assert [g.value for g in report.drift[0].groups] == ["1.26.4", "2"]  # tie: by value
    assert verdict_of(report) == "DRIFT: 1 key differs on 4 of 4 nodes (pkg.numpy)"


def test_groups_sorted_by_size_then_value_nodes_in_inventory_order():
    fps = {"n3": {"k": "b"}, "n1": {"k": "a"}, "n2": {"k": "c"}, "n10": {"k": "c"}}
    report = compare(fps, order=["n1", "n2", "n3", "n10"])
    assert [(g.nodes, g.value) for g in report.drift[0].groups] == [
        (["n2", "n10"], "c"),
        (["n1"], "a"),
        (["n3"], "b"),
    ]


def test_drift_ordered_errors_first_then_key():
    fps = fleet(worker_0={"kernel.release": "x", "pkg.zz": "1", "pkg.aa": "1"})
    assert [d.key for d in compare(fps).drift] == ["pkg.aa", "pkg.zz", "kernel.release"]


def test_values_of_different_types_stay_apart():
    report = compare({"a1": {"k": 1}, "a2": {"k": "1"}, "a3": {"k": True}, "a4": {"k": 1}})
    assert [(g.nodes, g.value) for g in report.drift[0].groups] == [
        (["a1", "a4"], 1),
        (["a2"], "1"),
        (["a3"], True),
    ]


def test_multi_line_and_long_values():
    fps = fleet(
        worker_1={"ssh.config": "Host *\n  ForwardAgent no\n  Port 22", "pkg.freeze": "x" * 300}
    )
    text = render(compare(fps))
    pad = " " * 18
    assert f"  worker-1      Host *\n{pad}ForwardAgent no\n{pad}Port 22\n" in text
    long_line = next(ln for ln in text.splitlines() if "xxx" in ln)
    assert long_line.endswith("…") and len(long_line) < 150
    many = render(compare({"a1": {"k": "\n".join(map(str, range(50)))}, "a2": {}}))
    assert "    11\n" in many and "    12\n" not in many and "    …\n" in many


def test_hashed_secrets_shown_as_given():
    report = compare(
        {"a1": {"env.HF_TOKEN": "sha256:1a2b3c4d"}, "a2": {"env.HF_TOKEN": "sha256:ffff"}}
    )
    assert "sha256:1a2b3c4d" in render(report) and "sha256:ffff" in render(report)


def test_color_only_when_asked():
    report = compare(fleet(worker_2={"pkg.numpy": "2.0.1"}))
    assert "\033[" not in render(report)
    colored = render(report, color=True)
    assert "\033[31m" in colored and "\033[0m" in colored
    assert "\033[32m" in render(compare(fleet()), color=True)


def test_render_is_deterministic():
    a = fleet(worker_2={"pkg.numpy": "2.0.1"}, worker_0={"kernel.release": "y"})
    b = {n: dict(reversed(list(fp.items()))) for n, fp in a.items()}
    assert render(compare(a)) == render(compare(b, order=list(a)))


def test_as_dict_shape():
    report = compare(
        fleet(worker_2={"pkg.numpy": "2.0.1"}),
        unreachable={"worker-3": "timeout"},
        checks=[{"node": "worker-1", "key": "ssh.mesh.to", "message": "refused"}],
    )
    d = report.as_dict()
    assert d == {
        "ok": False,
        "drift": [
            {
                "key": "pkg.numpy",
                "severity": "error",
                "groups": [
                    {"nodes": ["worker-0", "worker-1"], "value": "1.26.4"},
                    {"nodes": ["worker-2"], "value": "2.0.1"},
                ],
            }
        ],
        "unreachable": {"worker-3": "timeout"},
        "checks": [
            {"node": "worker-1", "key": "ssh.mesh.to", "message": "refused", "severity": "error"}
        ],
        "nodes": ["worker-0", "worker-1", "worker-2", "worker-3"],
        "compared_keys": 5,
        "per_platform": [],
    }
    assert json.loads(json.dumps(d)) == d
    assert isinstance(report, Report)


def test_baseline_round_trip(tmp_path):
    path = tmp_path / "runs" / "baseline.json"
    fingerprint_file_write(path, fleet(), {"taken": "2024-06-01T10:00:00Z", "inventory": "x.yml"})
    assert not list(path.parent.glob("*.tmp"))
    fps, meta = baseline_read(path)
    assert fps == fleet() and meta["inventory"] == "x.yml"
    assert list(fps) == ["worker-0", "worker-1", "worker-2"]

    unchanged = against_baseline(fleet(), fps)
    assert unchanged.ok
    assert verdict_of(unchanged) == "PARITY OK: 3 nodes unchanged since the baseline on 5 keys"

    now = fleet(worker_1={"pkg.numpy": "2.0.1"})
    del now["worker-2"]
    now["worker-3"] = dict(BASE)
    report = against_baseline(now, fps)
    assert not report.ok
    assert report.nodes == ["worker-0", "worker-1", "worker-3", "worker-2"]
    assert report.as_dict()["drift"] == [
        {
            "key": "pkg.numpy",
            "severity": "error",
            "groups": [
                {"nodes": ["worker-1"], "value": "1.26.4", "label": "baseline"},
                {"nodes": ["worker-1"], "value": "2.0.1", "label": "now"},
            ],
        }
    ]
    assert [(c["node"], c["key"]) for c in report.checks] == [
        ("worker-3", "baseline"),
        ("worker-2", "baseline"),
    ]
    assert "added since the baseline" in report.checks[0]["message"]
    assert "no fingerprint now" in report.checks[1]["message"]
    text = render(report)
    assert ("pkg.numpy\n  worker-1  baseline  1.26.4\n  worker-1  now       2.0.1\n") in text
    assert "worker-3  baseline: added since the baseline" in text
    assert verdict_of(report) == (
        "DRIFT: 1 key changed since the baseline on 1 of 2 nodes "
        "(pkg.numpy), odd node: worker-1; 2 checks failed"
    )


def test_baseline_same_change_on_many_nodes_is_one_drift():
    base = fleet(8)
    now = fleet(
        8,
        **{f"worker_{i}": {"torch.version": "2.6.0"} for i in range(6)},
        worker_7={"torch.version": "2.4.0", "kernel.release": "k2"},
    )
    report = against_baseline(now, base)
    torch = [d for d in report.drift if d.key == "torch.version"]
    assert [[(g.nodes, g.value, g.label) for g in d.groups] for d in torch] == [
        [
            ([f"worker-{i}" for i in range(6)], "2.5.1+cu124", "baseline"),
            ([f"worker-{i}" for i in range(6)], "2.6.0", "now"),
        ],
        [(["worker-7"], "2.5.1+cu124", "baseline"), (["worker-7"], "2.4.0", "now")],
    ]
    assert report.drift[-1].key == "kernel.release" and report.drift[-1].severity == "warning"
    assert "  worker-[0-5]  baseline  2.5.1+cu124\n" in render(report)
    assert "1 key changed since the baseline on 7 of 8 nodes" in verdict_of(report)


def test_baseline_unreachable_node_is_not_reported_as_removed(tmp_path):
    report = against_baseline(fleet(2), fleet(3), unreachable={"worker-2": "timeout"})
    assert report.checks == [] and report.unreachable == {"worker-2": "timeout"}


@pytest.mark.parametrize(
    "content, line, words",
    [
        (None, None, "baseline file not found"),
        ('{\n  "format": "nodeprep-fingerprint",\n  "version": 1,,\n}', 3, "not valid JSON"),
        ("[1, 2]", None, "not a nodeprep fingerprint file"),
        (
            '{"format": "nodeprep-fingerprint", "version": 99, "fingerprints": {}}',
            None,
            "version 99",
        ),
        (
            '{"format": "nodeprep-fingerprint", "version": 1, "fingerprints": {"w": 3}}',
            None,
            "must map node",
        ),
        (b"\xff\xfe\x00bad", 1, "byte 0xff at column 1 is not UTF-8 text"),
    ],
)
def test_bad_baseline_file_is_input_error(tmp_path, content, line, words):
    path = tmp_path / "base.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(InputError) as err:
        baseline_read(path)
    assert err.value.exit_code == 2 and err.value.file == str(path) and err.value.line == line
    assert str(err.value).startswith(f"{path}:{line}: " if line else f"{path}: ")
    assert words in str(err.value) and "\n" not in str(err.value)


def test_failed_write_leaves_old_baseline_and_no_temp_file(tmp_path):
    path = tmp_path / "base.json"
    fingerprint_file_write(path, fleet(), {})
    before = path.read_text()
    with pytest.raises(TypeError):
        fingerprint_file_write(path, {"w": {"k": object()}}, {})
    assert path.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base.json"]


def _mixed(**changes):
    """worker-0/1 aarch64, worker-2/3 x86_64, each platform on its own torch build and lock
    (the lab's mixed fleet: lab.up --arch aarch64 --arch worker-2=native ...)."""
    fps = fleet(4, **changes)
    for n, fp in fps.items():
        arm = n in ("worker-0", "worker-1")
        fp.setdefault("cpu.arch", "aarch64" if arm else "x86_64")
        fp.setdefault("pkg.torch", "2.8.0" if arm else "2.13.0+cpu")
        fp.setdefault(
            "env.shell.LD_LIBRARY_PATH",
            f"/opt/amazon/ofi-nccl/lib/{'aarch64' if arm else 'x86_64'}-linux-gnu",
        )
    return fps


def test_mixed_fleet_differences_that_follow_the_platform_are_expected_not_drift():
    from nodeprep.ops.verify.parity import split_by_platform

    fps = _mixed()
    report = compare(fps)
    split_by_platform(report, {n: fp["cpu.arch"] for n, fp in fps.items()})
    assert report.drift == [] and report.ok
    assert [d.key for d in report.per_platform] == [
        "cpu.arch",
        "env.shell.LD_LIBRARY_PATH",
        "pkg.torch",
    ]
    text = render(report)
    assert "expected per platform" in text and "3 keys differ per platform as expected" in text
    assert text.splitlines()[-1].startswith("PARITY OK: 4 nodes identical on")


@pytest.mark.parametrize(
    "changes,key",
    [
        # drift within one platform stays drift, even on a key that follows the platform
        ({"worker_1": {"pkg.torch": "2.7.0"}}, "pkg.torch"),
        # a key that does not follow the platform, aligned with it, is drift
        (
            {"worker_0": {"shell.login": "/bin/zsh"}, "worker_1": {"shell.login": "/bin/zsh"}},
            "shell.login",
        ),
        # a path that differs by more than the architecture's name is drift
        (
            {
                "worker_0": {"env.shell.LD_LIBRARY_PATH": "/opt/ofi/lib"},
                "worker_1": {"env.shell.LD_LIBRARY_PATH": "/opt/ofi/lib"},
            },
            "env.shell.LD_LIBRARY_PATH",
        ),
    ],
)
def test_mixed_fleet_real_drift_stays_drift(changes, key):
    from nodeprep.ops.verify.parity import split_by_platform

    fps = _mixed(**changes)
    report = compare(fps)
    split_by_platform(report, {n: fp["cpu.arch"] for n, fp in fps.items()})
    assert key in [d.key for d in report.drift] and not report.ok


def test_one_platform_fleet_is_never_split():
    from nodeprep.ops.verify.parity import split_by_platform

    fps = fleet(worker_2={"pkg.torch": "2.7.0"})
    report = compare(fps)
    split_by_platform(report, {n: "x86_64" for n in fps})
    assert [d.key for d in report.drift] == ["pkg.torch"] and report.per_platform == []
