"""`invoke ssh.prune`: remove from the controller's ssh config the managed blocks whose
inventory no longer exists (a lab taken down by hand, an inventory given by a temporary path,
one deleted or renamed), so their aliases no longer send ssh to machines that are gone.
Everything else in the file is kept byte for byte, its mode too; the file is replaced in
one rename."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from nodeprep.commands.options import PruneOptions
from nodeprep.errors import InputError
from nodeprep.ops.ssh import config_blocks
from nodeprep.settings import Settings


@dataclass
class PruneResult:
    path: Path
    removed: list[str]
    kept: list[str]
    written: bool


def prune(opts: PruneOptions, settings: Settings) -> PruneResult:
    path = Path(opts.config).expanduser()
    if not path.is_file():
        return PruneResult(path, [], [], False)
    try:
        old = path.read_bytes().decode("utf-8", errors="surrogateescape")  # \r\n kept as it is
    except OSError as e:
        raise InputError(
            f"cannot read {path}: {e.strerror}", hint=f"check its owner and mode (chmod 600 {path})"
        ) from None
    new, removed = config_blocks.prune(old, settings.project)
    kept = [name for name, _line in config_blocks.blocks(new)]
    if removed and not opts.dry_run:
        tmp = path.with_name(f".{path.name}.nodeprep-prune.tmp")
        tmp.write_bytes(new.encode("utf-8", errors="surrogateescape"))
        os.chmod(tmp, path.stat().st_mode & 0o777)
        os.replace(tmp, path)
    return PruneResult(path, removed, kept, bool(removed) and not opts.dry_run)
