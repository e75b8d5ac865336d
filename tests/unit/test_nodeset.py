import pytest

from nodeprep.inventory.nodeset import expand, fold, split_list


@pytest.mark.parametrize(
    "pattern, names",
    [
        ("login1", ["login1"]),
        ("worker-[0-3]", ["worker-0", "worker-1", "worker-2", "worker-3"]),
        ("gpu[01-04,07]", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"]),
        ("gpu[08-10]", ["gpu08", "gpu09", "gpu10"]),
        ("n[9-10]", ["n9", "n10"]),
        ("gpu[01:03]", ["gpu01", "gpu02", "gpu03"]),
        ("r[1-2]-n[1-2]", ["r1-n1", "r1-n2", "r2-n1", "r2-n2"]),
        ("[1-2]x", ["1x", "2x"]),
    ],
)
def test_expand(pattern, names):
    assert expand(pattern) == names


@pytest.mark.parametrize(
    "pattern, message",
    [
        ("worker-[3-1]", "goes backwards"),
        ("worker-[a-b]", "'a-b' is not a number"),
        ("worker-[1-3", "unclosed"),
        ("worker-1-3]", "']' without '['"),
        ("worker-[]", "is not a number"),
        ("w[[1-2]]", "unclosed"),
        ("", "empty"),
    ],
)
def test_expand_rejects(pattern, message):
    with pytest.raises(ValueError) as err:
        expand(pattern)
    assert message in str(err.value)


def test_split_list_slurm_syntax():
    assert split_list("gpu-[01-03,05],cpu1,n[1-2]-ib") == [
        "gpu-01",
        "gpu-02",
        "gpu-03",
        "gpu-05",
        "cpu1",
        "n1-ib",
        "n2-ib",
    ]


@pytest.mark.parametrize(
    "names, folded",
    [
        ([f"worker-{i}" for i in range(7)], "worker-[0-6]"),
        (["worker-5", "worker-0", "worker-1", "worker-2", "worker-3"], "worker-[0-3,5]"),
        (["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"], "gpu[01-04,07]"),
        (["gpu09", "gpu10", "gpu11"], "gpu[09-11]"),
        (["n9", "n10"], "n[9-10]"),
        (["worker-7"], "worker-7"),
        (["login", "gpu1", "gpu2", "login"], "login,gpu[1-2]"),
        (["gpu2", "cpu1", "gpu1"], "gpu[1-2],cpu1"),
        (["n1-ib", "n2-ib"], "n[1-2]-ib"),
        (["gpu1", "gpu01"], "gpu[01,1]"),
    ],
)
def test_fold(names, folded):
    assert fold(names) == folded


@pytest.mark.parametrize(
    "pattern",
    [
        "gpu[01-04,07]",
        "worker-[0-6]",
        "gpu[001-012],login[1-2]",
        "n[8-12]",
        "x[007,010-011]",
        "gpu-[01-03,05],cpu1,n[1-2]-ib",
    ],
)
def test_fold_inverts_split_list(pattern):
    names = split_list(pattern)
    assert fold(names) == pattern
    assert split_list(fold(names)) == names
