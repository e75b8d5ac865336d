"""Which cipher the controller's SSH connections prefer.

paramiko offers AES-CTR first, with an HMAC that it checks in Python, byte by byte
(`constant_time_bytes_eq`: ~64 calls a packet). With an AEAD cipher there is no separate MAC:
at 64 nodes the HMAC checks were the controller's largest own cost after the handshakes, and
a no-op provision took ~6 % less wall time with AES-GCM first (bench/scale_bench.py, the lab's
64-node shared home). Every other cipher paramiko offers stays offered after it, for servers
without GCM (OpenSSH has had it since 6.2)."""

from __future__ import annotations

import paramiko

GCM = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")


class GcmFirst(paramiko.Transport):
    """paramiko's Transport (handed to SSHClient.connect as its transport_factory) offering
    AES-GCM first, then paramiko's own list."""

    _preferred_ciphers = GCM + tuple(
        c for c in paramiko.Transport._preferred_ciphers if c not in GCM
    )
