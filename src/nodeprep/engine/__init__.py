"""The engine: reaching nodes and running things on them; it never imports a role or a command.

session.py     one node's connection for the run (pinned keys, retries, deadlines, logs)
connect_errors.py  why a node could not be reached; which connect failures a retry can fix
tcp.py         the TCP socket under it: Nagle off, the dead-peer rule, how it ended
bastions.py    jump hosts: one connection per bastion per run, each node a channel through it
fleet.py       the nodes of a run: sessions in parallel (bounded), a result per node
transports/    other ways a session's commands travel: local, through the head, Slurm
facts/         facts: a sh snippet plus a parser, ONE probe per node per phase
steps.py       a desired state checked against facts, acted on only when it differs
remote.py      remote file primitives as sh (atomic writes, stopping tagged processes)
locks.py       run locks on the nodes: one per shared home and one per machine
feed.py        a command fed a stream on its stdin over one channel, its output drained
hostkeys.py    the project's pinned known_hosts: pin on first contact, refuse a changed key
results.py     per-node results, the run directory (a log per node per stage, report.json)
events.py      the callbacks progress is reported through (the cli renders them)
runners.py     the Invoke runners every command runs under (no quadratic output re-join)
ciphers.py     paramiko's transport with AES-GCM offered first
fds.py         the open-file limit a run of N nodes needs
"""
