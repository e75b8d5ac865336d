"""`connection: local` (Ansible's ansible_connection=local): the node is the controller
itself, reached without ssh. Commands run here through Invoke with the same arguments a
Fabric connection takes, as the controller's user in its home; files are copied, not sent
over sftp. No host key is involved."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from invoke import Config, Context

from nodeprep.engine.runners import RUNNERS


class LocalFiles:
    """The two sftp calls nodeprep makes (ops.jobs), on this machine. A relative path is
    relative to the home directory, as on an sftp server."""

    @staticmethod
    def _path(path: str) -> str:
        path = os.path.expanduser(path)
        return path if os.path.isabs(path) else str(Path.home() / path)

    def put(self, local: str, remote: str) -> None:
        shutil.copyfile(local, self._path(remote))

    def posix_rename(self, old: str, new: str) -> None:
        os.replace(self._path(old), self._path(new))


class LocalConnection:
    """What Session needs of a fabric Connection: run, sftp, is_connected, close."""

    def __init__(self):
        self.is_connected = True
        self._context = Context(Config(overrides={"runners": dict(RUNNERS)}))

    def run(self, command: str, **kwargs):
        return self._context.run(command, **kwargs)

    def sftp(self) -> LocalFiles:
        return LocalFiles()

    def close(self) -> None:
        self.is_connected = False
