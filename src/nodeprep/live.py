"""Terminal progress: one row per node (stage, status), remote lines scrolling above.

Only imported when the output is a TTY, so pipes and CI never pay for rich."""
from __future__ import annotations

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from .report import Display

_STYLE = {"ok": "green", "changed": "yellow", "failed": "bold red", "unreachable": "bold red",
          "running": "cyan", "skipped": "dim"}


class LiveDisplay(Display):
    def __init__(self, stream):
        super().__init__(stream)
        self.console = Console(file=stream)
        self.rows: dict[str, list[str]] = {}
        self.live: Live | None = None

    def start(self, nodes):
        super().start(nodes)
        for n in nodes:
            self.rows.setdefault(n, ["", "waiting", ""])
        if self.live is None:
            self.live = Live(self._table(), console=self.console, refresh_per_second=8,
                             transient=False)
            self.live.start()

    def stop(self):
        if self.live is not None:
            self.live.update(self._table())
            self.live.stop()
            self.live = None

    def _table(self) -> Table:
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
