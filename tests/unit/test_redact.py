"""Secrets are masked at every depth wherever variables are shown (redact.py): a token nested
in deepspeed_env, a password in a list of mappings; names that hold a path are kept; the
values found at any depth feed the text redactor (logs, diffs, run bundles)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from nodeprep.redact import MASK, Redactor, masked, secret_values

ROOT = Path(__file__).resolve().parents[2]
NESTED = {
    "HF_HOME": "/scratch/hf",
    "WANDB_API_TOKEN": "tok-123456",
    "accounts": [{"user": "ops", "password": "hunter2hunter2"}],
    "deeper": {"a": {"db_pass": "p@ss-word"}},
}


def test_masked_at_every_depth():
    got = masked("deepspeed_env", NESTED)
    assert got["WANDB_API_TOKEN"] == MASK and got["HF_HOME"] == "/scratch/hf"
    assert got["accounts"] == [{"user": "ops", "password": MASK}] and got["deeper"] == {
        "a": {"db_pass": MASK}
    }
    assert masked("api_token", {"a": 1}) == MASK  # a secret name masks the whole value
    assert masked("key", "~/.ssh/id_ed25519", keep=("key",)) == "~/.ssh/id_ed25519"
    assert NESTED["WANDB_API_TOKEN"] == "tok-123456"  # the input is left as it was


def test_secret_values_at_every_depth_feed_the_redactor():
    values = secret_values("deepspeed_env", NESTED)
    assert sorted(values) == ["hunter2hunter2", "p@ss-word", "tok-123456"]
    r = Redactor.from_env({"deepspeed_env_TOKEN_map": {"x": "abcdefgh"}, "env": "plain"}, NESTED)
    assert r("x=abcdefgh y=tok-123456 z=/scratch/hf") == f"x={MASK} y={MASK} z=/scratch/hf"


def test_invoke_inventory_masks_the_nested_token_of_the_example_inventory():
    """inventory/lab sets deepspeed_env: {WANDB_API_TOKEN: replace-me}."""
    invoke = str(ROOT / ".venv" / "bin" / "invoke")
    for argv in (["--list", "--json"], ["--host", "gpu01", "--json"], ["--host", "gpu01"]):
        r = subprocess.run(
            [invoke, "inventory", "--inventory", "lab", *argv],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0 and "replace-me" not in r.stdout and MASK in r.stdout, r.stdout[
            -800:
        ]
    data = json.loads(
        subprocess.run(
            [invoke, "inventory", "--inventory", "lab", "--host", "gpu01", "--json"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    )
    assert data["variables"]["deepspeed_env"]["value"]["HF_HOME"] == "/scratch/hf"
