"""nodeprep.ops.launchenv.dsenv against DeepSpeed 0.19.8's runner (deepspeed/launcher/runner.py,
multinode_runner.py, accelerator/*_accelerator.py; the facts are in the module docstring)."""

from __future__ import annotations

import pytest

from nodeprep.ops.launchenv.dsenv import EnvFile, dropped, env_paths, forwarded, merged, parse

P = "/home/u/.deepspeed_env"


def _where(problems: list[str]) -> list[str]:
    """'path:line' of each problem."""
    return [p.split(": ", 1)[0] for p in problems]


def test_a_good_file_as_nodeprep_writes_it():
    text = (
        "LD_LIBRARY_PATH=/opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib:/usr/local/cuda/lib64\n"
        "FI_PROVIDER=efa\n"
        "NCCL_SOCKET_IFNAME==ens5\n"
        "WANDB_API_KEY=0123456789abcdef\n"
        "HF_HOME=/fsx/hf-cache\n"
    )
    f = parse(text, P)
    assert f.problems == []
    assert f.path == P
    assert f.entries == {
        "LD_LIBRARY_PATH": "/opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib:/usr/local/cuda/lib64",
        "FI_PROVIDER": "efa",
        "NCCL_SOCKET_IFNAME": "=ens5",
        "WANDB_API_KEY": "0123456789abcdef",
        "HF_HOME": "/fsx/hf-cache",
    }
    assert parse(text, P, launcher="openmpi").problems == []


def test_only_the_first_equals_splits_and_the_last_line_may_lack_a_newline():
    f = parse("NCCL_SOCKET_IFNAME==eth0,eth1\nA=b=c", P)
    assert f.entries == {"NCCL_SOCKET_IFNAME": "=eth0,eth1", "A": "b=c"}
    assert f.problems == []


def test_an_empty_file_and_an_empty_value_are_fine():
    assert parse("", P) == EnvFile(P, {}, [])
    f = parse("A=\n", P)
    assert (f.entries, f.problems) == ({"A": ""}, [])


def test_crlf_ends_lines_as_in_python_text_mode():
    f = parse("FI_PROVIDER=efa\r\nFI_EFA_USE_DEVICE_RDMA=1\r\n", P)
    assert f.entries == {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1"}
    assert f.problems == []
    lone_cr = parse("A=1\rB=2\r", P)
    assert lone_cr.entries == {"A": "1", "B": "2"} and lone_cr.problems == []


def test_blank_lines_are_not_skipped_they_crash_the_runner():
    f = parse("A=1\n\nB=2\n   \n\r\n", P)
    assert _where(f.problems) == [f"{P}:2", f"{P}:4", f"{P}:5"]
    assert f.problems[0] == (
        f"{P}:2: blank line, which DeepSpeed 0.19.8 does not skip: the runner "
        f"stops with ValueError (not enough values to unpack); delete the line"
    )
    assert f.entries == {"A": "1", "B": "2"}


def test_a_trailing_blank_line_crashes_too():
    f = parse("A=1\n\n", P)
    assert _where(f.problems) == [f"{P}:2"]
    assert "blank line" in f.problems[0]


def test_comment_lines_are_not_skipped():
    f = parse("# nodeprep managed\nA=1\n", P)
    assert f.problems == [
        f"{P}:1: comment line, which DeepSpeed 0.19.8 does not skip: the runner "
        f"stops with ValueError (not enough values to unpack); delete the line"
    ]
    assert f.entries == {"A": "1"}


def test_a_comment_with_equals_becomes_a_variable_and_under_pdsh_stops_every_rank():
    f = parse("A=1\n# B=2\n", P)
    assert f.entries == {"A": "1", "# B": "2"}
    [msg] = f.problems
    assert msg.startswith(f"{P}:2: comment line")
    assert "'# B'" in msg and "no rank starts" in msg and msg.endswith("; delete the line")
    [mpi] = parse("A=1\n# B=2\n", P, launcher="openmpi").problems
    assert "no rank starts" not in mpi and mpi.startswith(f"{P}:2: comment line")


def test_a_line_without_equals():
    f = parse("A=1\nFI_PROVIDER efa\n", P)
    assert f.problems == [
        f"{P}:2: no '=' in the line: the runner stops with ValueError (not enough "
        f"values to unpack); write it as NAME=value or delete it"
    ]
    assert f.entries == {"A": "1"}


def test_export_style_lines():
    f = parse("export FI_PROVIDER=efa\n", P)
    assert f.entries == {"export FI_PROVIDER": "efa"}
    assert f.problems == [
        f"{P}:1: DeepSpeed takes 'export FI_PROVIDER' as the variable name; "
        f"write it as FI_PROVIDER=value, without 'export'"
    ]


@pytest.mark.parametrize(
    "line, name",
    [("1A=x", "'1A'"), ("A-B=x", "'A-B'"), ("A.B=x", "'A.B'"), ("\ufeffA=x", "'\\ufeffA'")],
)
def test_invalid_names(line, name):
    [msg] = parse(f"OK=1\n{line}\n", P).problems
    assert msg == (
        f"{P}:2: {name} is not a valid variable name (letters, digits and _, not "
        f"starting with a digit); rename it or delete the line"
    )


def test_nothing_before_equals():
    assert parse("=x\n", P).problems == [
        f"{P}:1: no variable name before '='; write it as NAME=value or delete the line"
    ]


def test_whitespace_around_the_key_is_stripped_and_harmless():
    f = parse("  FI_PROVIDER\t=efa\n", P)
    assert (f.entries, f.problems) == ({"FI_PROVIDER": "efa"}, [])


def test_whitespace_around_the_value_is_stripped_and_reported():
    f = parse("A=1\nB= two words \nC=x\t\n", P)
    assert f.entries == {"A": "1", "B": "two words", "C": "x"}
    assert _where(f.problems) == [f"{P}:2", f"{P}:3"]
    assert f.problems[1] == (
        f"{P}:3: the value has leading or trailing whitespace, which DeepSpeed "
        f"strips; remove it (it cannot reach the ranks)"
    )


@pytest.mark.parametrize(
    "value", ["a b", "a;b", "a&b", "a|b", "a<b>", "(a)", "a*", "a?", "[a]", "a#b", "it's", "a!b"]
)
def test_pdsh_double_quotes_these_so_they_are_fine(value):
    assert parse(f"A={value}\n", P).problems == []


@pytest.mark.parametrize(
    "value, chars",
    [("$HOME/x", "'$'"), ("`id`", "'`'"), ('a"b', "'\"'"), ("a\\b", "'\\\\'"), ("$(id) x", "'$'")],
)
def test_pdsh_breaks_on_what_the_shell_reads_inside_double_quotes(value, chars):
    [msg] = parse(f"X=1\nA={value}\n", P).problems
    assert msg.startswith(f"{P}:2: the value contains {chars}, which the remote shell")
    assert "pdsh" in msg and msg.count("; ") == 1


def test_pdsh_does_not_expand_a_tilde_path():
    [msg] = parse("HF_HOME=~/hf\n", P).problems
    assert (
        msg == f"{P}:1: '~' in the value is not expanded, the pdsh launcher double-quotes it; "
        "write the full path"
    )
    assert len(parse("PATH=/bin:~/bin\n", P).problems) == 1
    assert parse("TOKEN=ab~cd\n", P).problems == []


def test_openmpi_passes_the_added_quotes_to_the_ranks():
    [msg] = parse("A=1\nB=a b;c\n", P, launcher="openmpi").problems
    assert msg.startswith(
        f"{P}:2: the value contains ' ', ';', so DeepSpeed wraps it in double quotes"
    )
    assert "openmpi" in msg and msg.count("; ") == 1
    assert parse("A=/x:y,z@h%1+2-3.4=5_\n", P, launcher="openmpi").problems == []
    [tilde] = parse("HF_HOME=~/hf\n", P, launcher="openmpi").problems
    assert "'~'" in tilde and "openmpi" in tilde


def test_values_are_never_echoed():
    secret = "s3cr3t value$"
    f = parse(f"WANDB_API_KEY={secret}\n", P)
    g = parse(f"WANDB_API_KEY= {secret}\n", P, launcher="openmpi")
    assert f.problems and g.problems
    assert not any(secret in p or "s3cr3t" in p for p in f.problems + g.problems)


def test_duplicates_later_wins_with_a_warning():
    f = parse("A=1\nB=2\nA=3\nA=4\n", P)
    assert f.entries == {"A": "4", "B": "2"}
    assert f.problems == [
        f"{P}:3: 'A' was already set on line 1 and this later value wins; "
        "keep only one of the two lines",
        f"{P}:4: 'A' was already set on line 3 and this later value wins; "
        "keep only one of the two lines",
    ]


def test_every_problem_has_the_shape_path_line_what_then_what_to_do():
    text = "\n# c\nexport A=1\n1B=2\nC= $x \nD\nC=y\n=z\n# E=1\n"
    f = parse(text, P)
    assert _where(f.problems) == [f"{P}:{n}" for n in (1, 2, 3, 4, 5, 5, 6, 7, 8, 9)]
    assert all(p.count("; ") == 1 for p in f.problems)


def test_unknown_launcher_is_refused():
    with pytest.raises(ValueError, match="slurm"):
        parse("A=1\n", P, launcher="slurm")


def test_env_paths_home_then_job_dir_and_ds_env_file():
    assert env_paths("/home/u", "/fsx/job") == ["/home/u/.deepspeed_env", "/fsx/job/.deepspeed_env"]
    assert env_paths("/home/u", "/fsx/job", {"DS_ENV_FILE": "job.env"}) == [
        "/home/u/job.env",
        "/fsx/job/job.env",
    ]
    assert env_paths("/home/u", "/fsx/job", {"DS_ENV_FILE": "/etc/ds.env"}) == ["/etc/ds.env"]
    assert env_paths("/home/u", "/home/u") == ["/home/u/.deepspeed_env"]


def test_merged_later_file_wins():
    home = parse("A=1\nB=2\n", "/home/u/.deepspeed_env")
    job = parse("B=3\nC=4\n", "/fsx/job/.deepspeed_env")
    assert merged([home, job]) == {"A": "1", "B": "3", "C": "4"}
    assert merged([job, home]) == {"A": "1", "B": "2", "C": "4"}
    assert merged([]) == {}


@pytest.mark.parametrize(
    "name, cpu, cuda",
    [
        ("PYTHONPATH", True, True),
        ("PYTHONUNBUFFERED", True, True),
        ("MLFLOW_TRACKING_URI", True, True),
        ("UCX_TLS", True, True),
        ("MV2_USE_CUDA", True, True),
        ("NCCL_DEBUG", False, True),
        ("NCCL_SOCKET_IFNAME", False, True),
        ("LD_LIBRARY_PATH", False, False),
        ("FI_PROVIDER", False, False),
        ("WANDB_API_KEY", False, False),
        ("HF_HOME", False, False),
        ("PATH", False, False),
        ("CUDA_VISIBLE_DEVICES", False, False),
        ("MY_PYTHONPATH", False, False),
        ("nccl_debug", False, False),
    ],
)
def test_forwarded_by_prefix(name, cpu, cuda):
    assert forwarded(name) is cpu
    assert forwarded(name, "cpu") is cpu
    assert forwarded(name, "cuda") is cuda


def test_forwarded_other_accelerators_and_unknown():
    assert forwarded("LD_LIBRARY_PATH", "npu") and forwarded("HCCL_CONNECT_TIMEOUT", "npu")
    assert not forwarded("NCCL_DEBUG", "xpu")
    with pytest.raises(ValueError, match="tpu"):
        forwarded("A", "tpu")


SHELL = {
    "LD_LIBRARY_PATH": "/opt/efa/lib",
    "FI_PROVIDER": "efa",
    "WANDB_API_KEY": "k",
    "NCCL_SOCKET_IFNAME": "=ens5",
    "PYTHONPATH": "/src",
    "HOME": "/home/u",
}
WANTED = [
    "LD_LIBRARY_PATH",
    "FI_PROVIDER",
    "WANDB_API_KEY",
    "NCCL_SOCKET_IFNAME",
    "PYTHONPATH",
    "HF_HOME",
]


def test_dropped_without_env_files_on_cuda():
    out = dropped(SHELL, WANTED, [], "cuda")
    assert [line.split(" ", 1)[0] for line in out] == [
        "LD_LIBRARY_PATH",
        "FI_PROVIDER",
        "WANDB_API_KEY",
    ]
    assert out[0] == (
        "LD_LIBRARY_PATH is set on the launching node but DeepSpeed's runner does not "
        "forward it (only MLFLOW*, PYTHON*, MV2*, UCX*, NCCL* and .deepspeed_env entries "
        "reach the ranks): add it to deepspeed_env in the inventory"
    )


def test_dropped_on_cpu_includes_nccl():
    out = dropped(SHELL, WANTED, [])
    assert [line.split(" ", 1)[0] for line in out] == [
        "LD_LIBRARY_PATH",
        "FI_PROVIDER",
        "WANDB_API_KEY",
        "NCCL_SOCKET_IFNAME",
    ]
    assert "(only MLFLOW*, PYTHON*, MV2*, UCX* and .deepspeed_env entries" in out[0]


def test_env_file_entries_are_not_dropped_in_either_file():
    home = parse("LD_LIBRARY_PATH=/opt/efa/lib\n", "/home/u/.deepspeed_env")
    job = parse("FI_PROVIDER=efa\nWANDB_API_KEY=k\n", "/fsx/job/.deepspeed_env")
    assert dropped(SHELL, WANTED, [home, job], "cuda") == []


def test_an_export_style_line_does_not_count_as_the_variable():
    f = parse("export FI_PROVIDER=efa\n", P)
    assert [line.split(" ", 1)[0] for line in dropped(SHELL, ["FI_PROVIDER"], [f], "cuda")] == [
        "FI_PROVIDER"
    ]


def test_unset_or_repeated_wanted_names():
    assert dropped({}, WANTED, []) == []
    assert len(dropped(SHELL, ["FI_PROVIDER", "FI_PROVIDER"], [])) == 1


def test_aisc_job_name_excludes_two_names_even_with_their_prefix():
    env = {
        "AISC_JOB_NAME": "j",
        "NCCL_IB_HCA": "mlx5",
        "UCX_NET_DEVICES": "mlx5_0:1",
        "NCCL_DEBUG": "INFO",
    }
    out = dropped(env, ["NCCL_IB_HCA", "UCX_NET_DEVICES", "NCCL_DEBUG"], [], "cuda")
    assert [line.split(" ", 1)[0] for line in out] == ["NCCL_IB_HCA", "UCX_NET_DEVICES"]
    assert "except NCCL_IB_HCA, UCX_NET_DEVICES (as AISC_JOB_NAME is set)" in out[0]
    env.pop("AISC_JOB_NAME")
    assert dropped(env, ["NCCL_IB_HCA", "UCX_NET_DEVICES"], [], "cuda") == []
