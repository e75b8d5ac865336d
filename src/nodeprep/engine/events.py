"""What the engine tells while it works, as callbacks (the way Ansible's executor never prints
and its callback plugins do). The engine and the commands call these; the cli passes an
object that renders them (nodeprep/cli/display.py). This base class shows nothing."""

from __future__ import annotations


class Events:
    def start(self, nodes: list[str]) -> None:
        """A run over these nodes begins."""

    def stop(self) -> None:
        """The run's connections are closed."""

    def status(self, node: str, stage: str, status: str, message: str = "") -> None:
        """NODE entered STAGE (status running) or finished it (ok, changed, failed, ...)."""

    def line(self, node: str, text: str) -> None:
        """A line of remote output streamed from NODE (train's ranks)."""

    def note(self, node: str, text: str) -> None:
        """Something about NODE the user should see once (a newly pinned host key)."""

    def log(self, text: str) -> None:
        """Controller-side progress (wheel downloads)."""
