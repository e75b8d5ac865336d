"""The operations layer: what commands use, one package per concern (docs/architecture.md).

  provision/   how `provision` runs roles: the role loader, Provisioning, Shared, Topology
  torchplan/   the torch build that fits a fleet's drivers and GPUs (data, nodes, rule, plan)
  pystack/     the Python stack: venv paths, the wheelhouse, wheels node to node (relay, sbcast)
  launchenv/   the environment launchers carry to the ranks: NCCL/aws-ofi-nccl, ~/.deepspeed_env
  ssh/         the ssh mesh: the controller's config blocks, logins from the head, the mesh on paper
  verify/      verify-parity: fingerprints, checks, parity, NCCL's own log
  health/      `health`: checks of GPUs, disk, memory, limits, clock, RDMA and the job network
               (findings with verdicts, codes and fixes; Xids)
  doctor/      `doctor`: the controller's and the first contact's checks, each with its fix
  container/   the container way: the image (registry reference or archive), its ID, whether a
               node's engine can run it
  sync/        a project's files as git sees them, for the job's sync
  stage/       data on every node's local disk: chunk sums, what each node lacks, the chains
  train/       `train`: launchers, the GPU split, emulation, preflight contract, the job's files
               and processes, the run directory, the rank watch, tracebacks of hung ranks

Packages import each other one way only (tests/unit/test_architecture.py checks it): provision,
torchplan and ssh import no other package; pystack imports provision and torchplan; launchenv
imports provision; verify and train stand on those; health imports none; doctor imports health
(its Finding) and ssh; sync and stage import pystack (the relay's chain hop). Code
that runs ON the nodes is not here: it is nodeprep/nodeside/.
"""
