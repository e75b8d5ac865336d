"""Jump hosts at run time: ONE ssh connection per bastion (per chain of hops) for the whole
run, and every node behind it reached as a channel through that connection (paramiko's
direct-tcpip, what OpenSSH's ProxyJump does with `-W`), never a bastion login per node.

A bastion is a host like any other: its key is pinned in the project's known_hosts on first
contact and a changed key is refused (every node behind it then fails with that reason, and
the bastion is logged into once, not once per node). A hop without a user logs in as the
node's user, with the node's key (then the agent and the default keys, as OpenSSH does).
A bastion that cannot be reached is tried once per run: the nodes behind it share the cause."""

from __future__ import annotations

import threading

import paramiko

from nodeprep.engine import ciphers, hostkeys, tcp
from nodeprep.engine.connect_errors import AuthFailed, Unreachable


class Bastions:
    def __init__(self, settings, store: hostkeys.PinnedHostKeys, events):
        self.settings = settings
        self.store = store
        self.events = events
        self._lock = threading.Lock()
        self._locks: dict[tuple, threading.Lock] = {}
        self._clients: dict[tuple, paramiko.SSHClient] = {}
        self._failed: dict[tuple, Exception] = {}
        self.logins = 0  # bastion logins this run (one per hop of a chain)

    def channel(self, host) -> paramiko.Channel:
        """A channel to HOST's sshd through its chain (host.jump), for Fabric's `sock`."""
        transport = self._client(host.jump, host).get_transport()
        try:
            return transport.open_channel(
                "direct-tcpip",
                (host.address, host.port),
                ("127.0.0.1", 0),
                timeout=self.settings.connect_timeout,
            )
        except (paramiko.ChannelException, paramiko.SSHException, OSError, EOFError) as e:
            raise Unreachable(
                f"cannot reach {host.address}:{host.port} through {host.jump[-1]}: "
                f"{getattr(e, 'text', None) or e or type(e).__name__}",
                hint="is the node up, and its sshd reachable from the bastion?",
            ) from None

    def _lock_of(self, chain: tuple) -> threading.Lock:
        with self._lock:
            return self._locks.setdefault(chain, threading.Lock())

    def _client(self, chain: tuple, host) -> paramiko.SSHClient:
        for i in range(1, len(chain) + 1):
            prefix = chain[:i]
            with self._lock_of(prefix):
                if prefix in self._failed:
                    raise self._failed[prefix]
                if prefix not in self._clients:
                    try:
                        self._clients[prefix] = self._login(prefix, host)
                    except (hostkeys.HostKeyChanged, Unreachable) as e:
                        self._failed[prefix] = e
                        raise
        return self._clients[chain]

    def _hop_socket(self, prefix: tuple):
        """A socket to the last hop of PREFIX: TCP to the first hop, else a channel through
        the hop before it (logged into already)."""
        hop, s = prefix[-1], self.settings
        if len(prefix) == 1:
            try:
                return tcp.connect(hop.address, hop.port, s.connect_timeout, s.silent_after)
            except OSError as e:
                raise Unreachable(
                    f"cannot reach the jump host {hop}: {e.strerror or e}",
                    hint="check the jump host's address and port",
                ) from None
        else:
            try:
                return (
                    self._clients[prefix[:-1]]
                    .get_transport()
                    .open_channel(
                        "direct-tcpip",
                        (hop.address, hop.port),
                        ("127.0.0.1", 0),
                        timeout=s.connect_timeout,
                    )
                )
            except (paramiko.ChannelException, paramiko.SSHException, OSError, EOFError) as e:
                raise Unreachable(
                    f"cannot reach the jump host {hop} through {prefix[-2]}: {e}"
                ) from None

    def _login(self, prefix: tuple, host) -> paramiko.SSHClient:
        hop, s = prefix[-1], self.settings
        sock = self._hop_socket(prefix)
        client = paramiko.SSHClient()
        hostkeys.attach(
            client,
            self.store,
            (hop.address, hop.port),
            s.pin_new_host_keys,
            on_pin=lambda name, key: self.events.note(
                host.name,
                f"pinned new host key of the "
                f"jump host {name} {key.get_name()} "
                f"{hostkeys.key_fingerprint(key)}",
            ),
        )
        try:
            client.connect(
                hop.address,
                port=hop.port,
                username=hop.user or host.user,
                key_filename=[host.key] if host.key else None,
                sock=sock,
                timeout=s.connect_timeout,
                banner_timeout=s.connect_timeout,
                auth_timeout=s.connect_timeout,
                transport_factory=ciphers.GcmFirst,
            )
        except paramiko.BadHostKeyException as e:
            raise hostkeys.HostKeyChanged(
                f"host key of the jump host {hop} "
                f"({hostkeys.host_entry(hop.address, hop.port)}) CHANGED: "
                f"pinned {hostkeys.key_fingerprint(e.expected_key)}, it offers "
                f"{hostkeys.key_fingerprint(e.key)}; refusing to connect through it",
                hint=f"if the jump host was reinstalled on purpose, run `invoke hosts.forget "
                f"{hop.address} --inventory INVENTORY` and connect again",
            ) from None
        except paramiko.AuthenticationException as e:
            raise AuthFailed(
                f"authentication failed on the jump host {hop}: {e}",
                hint="the node's user and key log in to the jump host too; give the "
                "hop its own user (user@host)",
            ) from None
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise Unreachable(f"cannot log in to the jump host {hop}: {e}") from None
        transport = client.get_transport()
        transport.set_keepalive(max(1, int(s.silent_after / 3)))
        self.logins += 1
        return client

    def close(self) -> None:
        for client in list(self._clients.values())[::-1]:
            client.close()
        self._clients.clear()
