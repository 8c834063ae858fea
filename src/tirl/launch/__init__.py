"""`tirl launch`: the files that run one tirl run across several machines on a cluster's own scheduler.

`layout.py` is the run's shape (which node does what, on which ports), checked once; `shell.py` the command lines
every renderer shares; `slurm.py` writes `tirl.sbatch` and `tirl-node.sh`, `k8s.py` one multi-document
`tirl.yaml`; `wait.py` (`python -m tirl.launch.wait`) is what a trainer node runs until the servers answer.

Deliberately not here: submitting, watching or cancelling jobs (the user runs `sbatch` or `kubectl`, and the files
are theirs to read and edit first), cloud provisioning, and any import of the trainer or the engines: the files
name tirl's commands, they never load them.
"""
