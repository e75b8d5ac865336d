"""Node health: is each node fit to run a job, beyond being identical to the others.

findings.py   Verdict (OK/WARN/UNKNOWN/CRITICAL), Finding, CheckSpec, Thresholds, Context
gpu.py        one node's GPUs: nvidia-smi, persistence, ECC, row remap, retired pages, PCIe,
              clock events, Xids, fabric manager, busy GPUs
nvlink.py     one node's NVLink: every link up, against the hardware or the node's other GPUs
node.py       one node besides its GPUs: disk, memory, /dev/shm, limits, clock
fleet.py      nodes against each other: GPU count, ECC and MIG modes, RDMA ports, the job
              network's speed and MTU
deep.py       the deep tier (--deep): DCGM's diagnostic, the GPU burn, the node's all_reduce
              against its model's floor (floors.yml, with sources)
drain.py      --drain / --undrain: what to tell Slurm about each node
xids.py       Xid lines of a kernel log and what each code means (xids.yml, NVIDIA's table)
catalogue.py  every check by name with its codes and sources; --check / --ignore
pairs.py      `bandwidth`: the rounds of pairs (ring shift, matching), the matrix, the slow node
"""
