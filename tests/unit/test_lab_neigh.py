"""lab/net.raise_neigh_table: the host's one IPv4 neighbour table is sized for every lab node
talking to every other (N x N entries) before it overflows and drops packets; it is only
ever raised, and a host that refuses the write gets a warning line, not a failure."""

from nodeprep.lab import net


def table(tmp_path, t2, t3):
    for k, v in (("gc_thresh2", t2), ("gc_thresh3", t3)):
        (tmp_path / k).write_text(f"{v}\n")
    return tmp_path


def values(root):
    return int((root / "gc_thresh2").read_text()), int((root / "gc_thresh3").read_text())


def test_a_big_lab_raises_both_limits_past_n_squared(tmp_path):
    root = table(tmp_path, 512, 1024)
    line = net.raise_neigh_table(128, root)
    t2, t3 = values(root)
    assert t2 >= 128 * 128 and t3 >= t2 and t3 > 1024
    assert line == f"neighbour table for 128 nodes: gc_thresh2 512 -> {t2}, gc_thresh3 1024 -> {t3}"


def test_limits_already_high_enough_are_left_alone_and_never_lowered(tmp_path):
    root = table(tmp_path, 10**6, 2 * 10**6)
    assert net.raise_neigh_table(128, root) is None
    assert values(root) == (10**6, 2 * 10**6)


def test_a_small_lab_fits_the_kernel_defaults(tmp_path):
    root = table(tmp_path, 512, 1024)
    assert net.raise_neigh_table(2, root) is None
    assert values(root) == (512, 1024)


def test_a_read_only_table_gives_a_warning_line(tmp_path):
    line = net.raise_neigh_table(128, tmp_path / "missing")
    assert line.startswith("warning: cannot raise net.ipv4.neigh.default.gc_thresh2 to ")
    assert "may overflow" in line
