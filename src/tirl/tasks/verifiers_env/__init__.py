"""Environments of verifiers (prime-rl's environment format, the PyPI package `verifiers` >= 0.4, its `verifiers.v1`
API) as tirl tasks: `task=verifiers:ENV`, ENV the environment's id or module as `vf-eval` takes it. Importing
this package only names the task source (`task.py` builds the Task, importing verifiers then), so tirl never
needs verifiers unless such a task is loaded (`pip install 'tirl[verifiers]'`)."""

from tirl.tasks.task import register_task_source

register_task_source("verifiers", "tirl.tasks.verifiers_env.task:verifiers_task", usage="verifiers:ENV")
