"""The commands: each takes its options object (options.py), orchestrates the layers below and
returns a result object; it never prints (the cli renders results).

  options.py     one options class per command, built once from the task's flags
  common.py      what every command does first: load the inventory, select its nodes
  inventory.py   `invoke inventory`: what was read, with origins (no node contacted)
  facts.py       `invoke facts`: one probe per node
  init.py        `invoke init`: a first inventory from what the user has, each node contacted once
  health.py      `invoke health`: one probe per node, the checks of ops/health, findings
  bandwidth.py   `invoke bandwidth`: rounds of node pairs sending at once, the matrix, the slow node
  doctor.py      `invoke doctor`: the controller's checks and first contact with the nodes, fixes
  hosts.py       `invoke hosts.forget`: drop pinned host keys after a reinstall
  ssh_prune.py   `invoke ssh.prune`: drop the ssh config blocks of inventories that are gone
  provision.py   `invoke provision`: probe, locks, the controller's work, the report
  waves.py       its plan-and-apply: each node's steps checked, room, one batched apply, waves
  torch_plan.py  `invoke torch-plan`: the torch build for a fleet, offline
  verify.py      `invoke verify-parity`: probes, fingerprints, checks, the mesh, parity
  collective.py  `verify-parity --collective`: an all_reduce through the train path
  stage.py       `invoke stage`: data on every node's local disk (room, chains, arrival check)
  train/         `invoke train` and train.status / logs / stop
"""
