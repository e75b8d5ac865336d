"""What `train` uses: pure builders and decisions, and a job's files on the nodes.

launchplan.py  the LaunchPlan: built once from the fleet's facts, checked by preflight,
               run by the supervisor; every launcher's command lines are built here
launchers.py   argv builders for deepspeed, torchrun, mpirun and srun (pure)
incontainer.py the container way: the job's container on each node (NodeContainer), the
               ranks' commands exec'd into it, DeepSpeed per node with --no_ssh
gpusplit.py    one machine's GPUs split evenly between nodes (shared machines, --emulate)
emulate.py     `--emulate M`: one machine as M nodes (ssh aliases to itself)
contract.py    the launch contract preflight checks: programs on the non-interactive PATH,
               ~/.deepspeed_env as DeepSpeed reads it, the master port reachable
payload.py     the payload (a builtin or the user's script) and the agent, synced to the nodes
processes.py   a job's processes on a node: found by JOB_VAR, stale ones, cleanup
rundir.py      a training run's directory on the controller (job.json, logs, exits, summary)
rankwatch.py   what the watchers report and what nodeprep decides from it (pure)
causes.py      the class of a failed run's root cause (node, hardware, user, ...) and whom it blames
restarts.py    train --restarts: after a failed attempt, relaunch (on which nodes) or stop (pure)
quarantine.py  the nodes --restarts took out of service, kept on the controller until released
tracebacks.py  faulthandler dumps of hung ranks parsed, and the rank most likely at fault
"""
