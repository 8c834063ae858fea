"""`task=verifiers:ENV`: a verifiers environment as a tirl Task, built once per process and environment.

The pieces, each in its module: loading the environment (`load.py`), the refusal of what tirl cannot run
(`support.py`), its tasks as rows split by a seed (`rows.py`), its toolsets as function tools (`tools.py`) and
its rewards as the verifier (`reward.py`). The verifier and the data source are both named `verifiers:ENV`, so
the environment's rows are graded by its own rewards and nothing else; the verifier is registered when the task
is first built (`load_task` asks for it again as the config loads: the same Task comes back).
"""

from __future__ import annotations

import functools

from tirl.rewards import register_verifier
from tirl.tasks.task import Task
from tirl.tasks.verifiers_env.load import load_env
from tirl.tasks.verifiers_env.reward import env_grader
from tirl.tasks.verifiers_env.rows import VerifiersOptions, env_rows
from tirl.tasks.verifiers_env.support import check_supported
from tirl.tasks.verifiers_env.tools import env_tools


@functools.cache
def verifiers_task(env_id: str) -> Task:
    """The Task of the verifiers environment `env_id` (ENV of `task=verifiers:ENV`); a ValueError naming what is
    wrong or unsupported otherwise (a failed load is not cached)."""
    env = load_env(env_id)
    first = env.first_task()
    check_supported(env, first)
    tools = env_tools(env, first)
    register_verifier(env.spec, env_grader(env, first), replace=True)
    return Task(
        env.spec,
        tools=tools,
        verifier=env.spec,
        data_sources=(env.spec,),
        rows=functools.partial(env_rows, env),
        options=VerifiersOptions,
    )
