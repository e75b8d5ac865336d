"""One node's connection for a whole run (as Fabric's Connection): a `Session` opens it lazily
(pinned host keys, retries only for errors a retry can fix, Nagle off, AES-GCM first), runs
every remote command of the run through it as POSIX sh with a deadline enforced on the node,
logs each command and its exit, and streams output lines to the run's events. Its
`NodeResult` is the node's outcome; engine/fleet.py runs sessions in parallel.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import io
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import paramiko
from fabric import Connection
from invoke.exceptions import CommandTimedOut

from nodeprep.engine import ciphers, hostkeys, tcp
from nodeprep.engine.connect_errors import AuthFailed, Unreachable, connect_error
from nodeprep.engine.remote import RUN_VAR
from nodeprep.engine.results import NodeResult
from nodeprep.engine.transports.local import LocalConnection

# paramiko's transport thread logs a failed handshake (a node that is down) with a traceback;
# with no handler configured, Python's last-resort handler printed it on stderr. The engine
# reports the node as unreachable itself, in one line.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


@dataclass
class CmdResult:
    rc: int
    stdout: str
    stderr: str
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def tail(self, lines: int = 12) -> str:
        text = (self.stderr.strip() or self.stdout.strip()).splitlines()
        return "\n".join(text[-lines:])


def posix(script: str, timeout: float | None = None) -> str:
    """Wrap a POSIX sh script so any login shell runs it: tcsh or fish cannot parse `export`
    or `$(...)`, but every shell can run a pipe of plain words into /bin/sh. With a timeout,
    coreutils `timeout` enforces it ON the node (TERM, then KILL 5 s later): closing the SSH
    channel alone would leave the command running there."""
    blob = base64.b64encode(script.encode()).decode()
    limit = f"timeout -k 5 {int(timeout)} " if timeout else ""
    return f"echo {blob} | base64 -d | {limit}/bin/sh"


class _LineSink:
    """File-like object Invoke writes remote output to: logs every byte, and shows complete
    lines prefixed with the node name when streaming is on."""

    def __init__(
        self, log, show: Callable[[str], None] | None, watch: Callable[[str], None] | None = None
    ):
        self.log = log
        self.show = show
        self.watch = watch
        self.buf = ""

    def write(self, data: str):
        self.log.write(data)
        if self.show or self.watch:
            self.buf += data
            *lines, self.buf = self.buf.split("\n")
            for line in lines:
                self._line(line)

    def _line(self, line: str):
        if self.watch:
            self.watch(line)
        if self.show:
            self.show(line)

    def flush(self):
        # Invoke flushes after every chunk it writes: a partial line stays buffered here
        self.log.flush()

    def finish(self):
        """The command ended: its last line, even without a newline."""
        self.log.flush()
        if self.buf:
            self._line(self.buf)
            self.buf = ""


class Session:
    """A node's connection plus its log; every remote command of the run goes through it."""

    def __init__(self, host, fleet):
        """FLEET: the engine.fleet.Fleet of the run (settings, host keys, logs, events)."""
        self.host = host
        self.settings = fleet.settings
        self.store = fleet.store
        self.runlog, self.events = fleet.runlog, fleet.events
        self.name = host.name
        self.stage = "connect"
        self.doing: str | None = None  # the command running now (what a Ctrl-C interrupts)
        self._outer: str | None = None  # the work a busy() block names, around its commands
        self._conn: Connection | None = None
        # engine/transports/slurmrun.Transport when the run rides Slurm (--via slurm): every
        # run() goes into a batch the head runs as one srun step; only the head holds an ssh
        # connection
        self.transport = None
        self._fabric_config = fleet.fabric_config
        self._bastions = fleet.bastions
        self._password = fleet.password  # --ask-pass: in memory only, never logged
        self.pinned_now = False  # this run pinned the node's host key (first contact)
        self._tag = f"{RUN_VAR}={fleet.run_id}; export {RUN_VAR}\n"
        self.result = NodeResult(host.name)

    # -- connection -------------------------------------------------------------------------
    @property
    def conn(self) -> Connection | None:
        """The node's own connection. Under a Slurm transport a node gets one only when
        something needs it (an sftp upload): its commands go through srun."""
        if self._conn is None and self.transport is not None:
            self._ssh()
        return self._conn

    @property
    def connected(self) -> bool:
        """Whether this node was reached: over its own ssh connection or through Slurm."""
        return self._conn is not None or (
            self.transport is not None and self.transport.reached(self)
        )

    def connect(self) -> None:
        if self.transport is not None and not self.transport.is_head(self):
            return  # its commands go through the head's srun
        self._ssh()

    def _ssh(self) -> None:
        if self._conn is not None and self._conn.is_connected:
            return
        h, s = self.host, self.settings
        if getattr(h, "connection", "ssh") == "local":  # the controller itself, no ssh
            self._conn = LocalConnection()
            return
        kwargs = self._connect_kwargs()
        delay, tried = s.retry_backoff, []
        self.doing = f"connecting to {h.address}:{h.port}"
        for attempt in range(s.connect_retries + 1):
            conn = self._connection(kwargs)
            t0 = time.monotonic()
            try:
                conn.connect_kwargs["sock"] = (
                    self._bastions.channel(h)
                    if getattr(h, "jump", ())
                    else tcp.connect(h.address, h.port, s.connect_timeout, s.silent_after)
                )
                conn.open()
                self._conn, self.doing = conn, None
                return
            except paramiko.BadHostKeyException as e:
                raise hostkeys.HostKeyChanged(
                    f"host key for {h.name} ({hostkeys.host_entry(h.address, h.port)}) CHANGED: "
                    f"pinned {hostkeys.key_fingerprint(e.expected_key)}, node offers "
                    f"{hostkeys.key_fingerprint(e.key)}; refusing to connect",
                    hint="if the node was reinstalled on purpose, run "
                    f"`invoke hosts.forget {h.name}` and connect again",
                ) from None
            except paramiko.AuthenticationException as e:
                raise AuthFailed(
                    f"authentication failed for {h.user or 'current user'}@"
                    f"{h.address}:{h.port}: {e}",
                    hint="check the inventory's user/key for this node",
                ) from None
            except (paramiko.SSHException, OSError, EOFError) as e:
                why, retry = connect_error(e, time.monotonic() - t0, s.connect_timeout)
                tried.append(why)
                if not retry or attempt == s.connect_retries:
                    raise Unreachable(
                        f"cannot reach {h.address}:{h.port}: {why}"
                        + (f" ({len(tried)} tries)" if len(tried) > 1 else ""),
                        hint=None if retry else "--connect-timeout S waits longer",
                    ) from None
                self.log(
                    f"connect attempt {attempt + 1} failed ({why}); retrying in {delay:.1f}s\n"
                )
                time.sleep(delay)
                delay *= 2

    def _connect_kwargs(self) -> dict[str, Any]:
        """paramiko's connect arguments for this node: AES-GCM first, the timeouts, its key
        and the --ask-pass password."""
        h, s = self.host, self.settings
        kwargs: dict[str, Any] = {
            "transport_factory": ciphers.GcmFirst,
            "banner_timeout": s.connect_timeout,
            "auth_timeout": s.connect_timeout,
        }
        if h.key:
            kwargs.update(key_filename=[str(Path(h.key).expanduser())])
        if self._password:
            kwargs.update(password=self._password)  # tried after the keys, as OpenSSH does
        return kwargs

    def _connection(self, kwargs: dict[str, Any]) -> Connection:
        """A new, unopened Connection to this node, its host key checked against the pinned
        ones (pinned on first contact where allowed)."""
        h, s = self.host, self.settings
        # A Config per connection: Connection.__init__ writes to its config, and a shared
        # one raced across threads ("No attribute or config key found for 'gateway'").
        conn = Connection(
            h.address,
            user=h.user,
            port=h.port,
            config=self._fabric_config.clone(),
            connect_timeout=s.connect_timeout,
            connect_kwargs=kwargs,
        )
        hostkeys.attach(
            conn.client,
            self.store,
            (h.address, h.port),
            s.pin_new_host_keys,
            on_pin=self._pinned,
        )
        return conn

    def login(self) -> dict:
        """How this node was logged in to: {method (publickey, password, local), host_key
        (its SHA256 fingerprint), pinned_now (first contact: pinned by this run)}."""
        if self._conn is None or isinstance(self._conn, LocalConnection):
            return {
                "method": "local" if self._conn is not None else None,
                "host_key": None,
                "pinned_now": False,
            }
        t = self._conn.client.get_transport()
        handler = getattr(t, "auth_handler", None)
        key = t.get_remote_server_key() if t is not None else None
        return {
            "method": getattr(handler, "auth_method", None),
            "host_key": hostkeys.key_fingerprint(key) if key is not None else None,
            "pinned_now": self.pinned_now,
        }

    def _pinned(self, hostname, key):
        self.pinned_now = True
        self.events.note(
            self.name,
            f"pinned new host key {hostname} {key.get_name()} "
            f"{hostkeys.key_fingerprint(key)} in {self.store.path}",
        )

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- commands ---------------------------------------------------------------------------
    def log(self, text: str) -> None:
        self.runlog.node_log(self.name, self.stage).write(text)

    def run(
        self,
        script: str,
        *,
        timeout: float | None = None,
        stream=None,
        label: str | None = None,
        log_output: bool = True,
        on_line: Callable[[str], None] | None = None,
    ) -> CmdResult:
        """Run a POSIX sh script on the node; never raises for a non-zero exit.

        log_output=False for probes and applies: their output carries file contents, which
        may hold secrets (a token in ~/.deepspeed_env, the cluster key). STREAM: show the
        output's lines as they come, under the node's name (True), another name (an emulated
        node's alias), or the name a function of the line returns (srun's task labels).
        Under a Slurm transport the script joins the stage's batch (one srun step for all
        nodes) and its output is shown and logged when its node's answer comes back."""
        self.connect()
        log = self.runlog.node_log(self.name, self.stage)
        self.doing = label or script.strip().splitlines()[0][:200]
        log.write(f"$ {self.doing}\n")
        show = self._shower(stream)
        sink = log if log_output else io.StringIO()
        out, err = _LineSink(sink, show, on_line), _LineSink(sink, show)
        limit = max(1, int(timeout or self.settings.command_timeout))
        if self.transport is not None:
            res = self.transport.run(self, self._tag + script, limit)
            out.write(res.stdout)
            err.write(res.stderr)
            out.finish()
            err.finish()
            return self._logged(log, res, log_output)
        return self._logged(log, self._run_ssh(script, limit, out, err, label), log_output)

    def _shower(self, stream) -> Callable[[str], None] | None:
        if callable(stream):  # the name depends on the line (srun --label: task -> node)
            return lambda line: self.events.line(stream(line), line)
        if stream:
            name = self.name if stream is True else stream
            return lambda line: self.events.line(name, line)
        return None

    def _logged(self, log, res: "CmdResult", log_output: bool) -> "CmdResult":
        self.doing = self._outer
        if not log_output:
            log.write(f"[{len(res.stdout)} bytes of output not logged]\n")
        log.write(f"[exit {res.rc}]\n")
        log.flush()
        return res

    def run_ssh(self, script: str, timeout: float, label: str) -> "CmdResult":
        """SCRIPT over this node's own ssh connection, whatever the transport (the head's
        srun steps); output not logged (it carries every node's answer)."""
        self._ssh()
        log = self.runlog.node_log(self.name, self.stage)
        log.write(f"$ {label}\n")
        sink = io.StringIO()
        out, err = _LineSink(sink, None), _LineSink(sink, None)
        return self._logged(
            log, self._run_ssh(script, max(1, int(timeout)), out, err, label), False
        )

    @contextlib.contextmanager
    def busy(self, doing: str):
        """Work of this node that is no remote command (an sftp upload): what a Ctrl-C names."""
        self.doing = self._outer = doing
        try:
            yield
        finally:
            self.doing = self._outer = None

    def silent(self) -> bool:
        """Did the node go silent: its connection dropped by the dead-peer rule (the kernel's
        ETIMEDOUT: nothing acknowledged for silent_after s)? A connection the node closed or
        reset (sshd killed, the node rebooting) is no silence: the caller sees it end."""
        client = getattr(self._conn, "client", None)
        if self._conn is None or client is None or isinstance(self._conn, LocalConnection):
            return False
        transport = client.get_transport()
        if transport is None or transport.is_active():
            return False
        sock = transport.sock
        e = getattr(sock, "error", None)
        return (isinstance(e, OSError) and e.errno == errno.ETIMEDOUT) or (
            e is None and getattr(sock, "aborted", False)
        )

    def silence(self, doing: str) -> Unreachable:
        """The error for a node that went silent while DOING."""
        return Unreachable(
            f"silent for {self.settings.silent_after:.0f} s during {doing}: the node "
            "stopped answering (power, network or a hung kernel); its remaining "
            "steps are not run",
            hint="bring it back, then run again",
        )

    def _run_ssh(
        self, script: str, limit: int, out: "_LineSink", err: "_LineSink", label: str | None = None
    ) -> "CmdResult":
        t0 = time.monotonic()
        try:
            # The local timer is only a backstop for a connection that hangs.
            r = self._conn.run(
                posix(self._tag + script, limit),
                hide=False,
                warn=True,
                in_stream=False,
                out_stream=out,
                err_stream=err,
                timeout=limit + 15,
            )
            res = CmdResult(r.exited, r.stdout, r.stderr)
            if r.exited in (124, 137, -1) and time.monotonic() - t0 >= limit - 0.5:
                res.timed_out = True
                res.stderr += f"\n(timed out after {limit}s)"
        except CommandTimedOut as e:
            res = CmdResult(
                124,
                e.result.stdout,
                e.result.stderr + f"\n(timed out after {limit}s; connection hung)",
                timed_out=True,
            )
        finally:
            out.finish()
            err.finish()
        if res.rc == -1 and self.silent():  # no exit status: the connection was dropped
            raise self.silence(f"'{label or script.strip().splitlines()[0][:80]}'")
        return res
