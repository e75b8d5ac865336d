"""What `verify-parity` compares and checks.

fingerprints.py  the facts a node's probe asks for and its fingerprint (flat comparable keys)
checks.py        per-node problems that make launches fail or hang, the mesh per pair, and
                 the fleet comparison (GPU keys among GPU nodes only)
parity.py        equal values grouped under folded node sets; baselines
nccllog.py       what NCCL's own log (NCCL_DEBUG=INFO) says: net plugin, network, transports
"""
