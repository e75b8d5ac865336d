"""Ways a session's commands reach a node other than its own ssh connection.

local.py      `connection: local`: the controller itself, through Invoke, no ssh
fanout.py     probes that ride the head node's OpenSSH logins to the other nodes
slurm.py      one stage's per-node scripts as ONE srun step: the scripts and their parsing
slurmrun.py   that transport at work (--via slurm): Session.run batched into steps, sbcast
"""
