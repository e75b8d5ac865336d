"""Renders the engine's events (engine/events.py): plain, line-oriented output for pipes, CI and
--json; a live per-node table on a terminal."""

from __future__ import annotations

import os
import sys
import threading

from nodeprep.engine.events import Events


class Display(Events):
    """One line per node status change and node-prefixed remote output. Writes to stderr
    when stdout carries data (a table, JSON)."""

    def __init__(self, stream=None, quiet: bool = False):
        self.stream = stream or sys.stdout
        self.quiet = quiet
        self._lock = threading.Lock()
        self.width = 8

    @staticmethod
    def auto(to_stderr: bool = False, quiet: bool = False) -> "Display":
        """to_stderr: for tasks whose stdout is data (a table, JSON); quiet: no per-node
        status lines (notes such as a newly pinned host key are always shown)."""
        stream = sys.stderr if to_stderr else sys.stdout
        if stream.isatty() and not quiet and os.environ.get("TERM") != "dumb":
            return LiveDisplay(stream)
        return Display(stream, quiet)

    def _emit(self, text: str) -> None:
        with self._lock:
            self.stream.write(text + "\n")
            self.stream.flush()

    def start(self, nodes: list[str]) -> None:
        self.width = max([len(n) for n in nodes] + [8])

    def status(self, node: str, stage: str, status: str, message: str = "") -> None:
        if self.quiet or status == "running":
            return
        self._emit(f"{node:<{self.width}}  {stage}: {status}" + (f"  {message}" if message else ""))

    def line(self, node: str, text: str) -> None:
        self._emit(f"[{node}] {text}")

    def note(self, node: str, text: str) -> None:
        self._emit(f"{node:<{self.width}}  {text}")

    def log(self, text: str) -> None:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()


_STYLE = {
    "ok": "green",
    "changed": "yellow",
    "failed": "bold red",
    "unreachable": "bold red",
    "running": "cyan",
    "skipped": "dim",
}


class LiveDisplay(Display):
    """Terminal progress: one row per node (stage, status), remote lines scrolling above.
    rich is imported only here, so pipes and CI never pay for it."""

    def __init__(self, stream):
        from rich.console import Console

        super().__init__(stream)
        self.console = Console(file=stream)
        self.rows: dict[str, list[str]] = {}
        self.live = None  # a rich.live.Live while shown

    def start(self, nodes):
        super().start(nodes)
        for n in nodes:
            self.rows.setdefault(n, ["", "waiting", ""])
        if self.live is None:
            from rich.live import Live

            self.live = Live(
                self._table(), console=self.console, refresh_per_second=8, transient=False
            )
            self.live.start()

    def stop(self):
        if self.live is not None:
            self.live.update(self._table())
            self.live.stop()
            self.live = None

    def _table(self):
        from rich.table import Table
        from rich.text import Text

        t = Table(box=None, pad_edge=False, show_header=True, header_style="bold")
        for col in ("node", "stage", "status", ""):
            t.add_column(col, overflow="fold" if not col else "ellipsis")
        # Large fleets: show the unfinished and failed nodes first, cap the height.
        rows = sorted(self.rows.items(), key=lambda kv: kv[1][1] in ("ok", "changed"))
        for node, (stage, status, msg) in rows[:40]:
            t.add_row(node, stage, Text(status, style=_STYLE.get(status, "")), msg[:80])
        if len(rows) > 40:
            t.add_row(f"... {len(rows) - 40} more", "", "", "")
        return t

    def _refresh(self):
        if self.live is not None:
            self.live.update(self._table())

    def status(self, node, stage, status, message=""):
        with self._lock:
            self.rows[node] = [stage, status, message]
            self._refresh()

    def _emit(self, text):
        with self._lock:
            self.console.print(text, markup=False, highlight=False)
