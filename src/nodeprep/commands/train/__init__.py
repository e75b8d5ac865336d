"""`invoke train` and the tasks that follow a run.

run.py        train(): each attempt prepared and launched; with --restarts, what follows a
              failed one (ops/train/restarts.py decides), spares joined, nodes quarantined
launch.py     one launch: the RunSpec from the plan, --dry-run's commands, the supervised run
spares.py     a spare node made ready to take a quarantined one's place (provision, parity)
jobvars.py    the inventory's train_* variables: --restarts and its kin where no flag is given
staged.py     --stage: the inventory's stages run on the job's nodes before launch
slurmdrain.py --drain: the nodes a relaunch quarantines drained in Slurm
prepare.py    the probe, the LaunchPlan (ops/train/launchplan.py), preflight, the job sync
gate.py       the health gate: the passive health checks on the same probe, CRITICAL refused
              (or the node left out with --exclude-unhealthy)
preflight.py  what blocks a launch, one line each with the node and the fix
runspec.py    the RunSpec (the run's job.json) and the Outcome of a run
supervise.py  the run and its watch: launchers under setsid, the rank watch, stop everything
              on the first failure, hang or timeout, the run directory written on the way
containers.py the container way: the job's container started on every node before the launch,
              removed after it whatever the end, looked for among the leftovers
control.py    train.status / train.logs / train.stop over a run's directory and its nodes
"""

from nodeprep.commands.train.run import TrainResult, train

__all__ = ["TrainResult", "train"]
