"""The environment the launchers carry to every rank.

ncclenv.py   the NCCL / aws-ofi-nccl variables a node needs (library paths, socket interface),
             written by the nccl and deepspeed_env roles
dsenv.py     what DeepSpeed's runner does with ~/.deepspeed_env and the launching shell's
             environment: lines it misreads, variables that never reach the ranks
"""
