"""A small verifiers environment, written against verifiers' own API (`verifiers.v1`) and nothing of tirl's:
twelve arithmetic questions, a calculator toolset the model may call, and a reward for the right boxed answer.

Train on it with tirl (from the repository root, after `make demo`, whose SFT model has learned tool calls):

    PYTHONPATH=examples/verifiers_env tirl rl model.path=runs/demo/sft/model task=verifiers:verifiers-arith \\
        rl.steps=10 rl.prompts_per_step=4 rl.n=4 rl.mini_batch_size=16 --out runs/rl-verifiers-arith

tirl loads the taskset as verifiers does (the module `verifiers_arith`, found on the import path), holds out a
fifth of the questions as the test split (`task.test_fraction`, fixed by the run's seed), lists the toolset's
`calc_add` and `calc_multiply` as function tools run in its own process (they only add and multiply: no model
input is ever executed), and grades each response with `correct` below: +1 and correct for the right box, -1
otherwise. `vf-eval verifiers-arith` runs the same environment under verifiers.
"""

import verifiers.v1 as vf

QUESTIONS = [
    ("What is 17 + 25?", "42"),
    ("What is 9 * 8?", "72"),
    ("What is 123 + 456?", "579"),
    ("What is 12 * 11?", "132"),
    ("What is 1000 - 1?", "999"),
    ("What is 7 * 7 + 1?", "50"),
    ("What is 64 + 36?", "100"),
    ("What is 15 * 4?", "60"),
    ("What is 250 + 250?", "500"),
    ("What is 13 * 3?", "39"),
    ("What is 81 - 18?", "63"),
    ("What is 6 * 6 * 6?", "216"),
]
SYSTEM_PROMPT = "Use the calculator tools if they help. Answer as \\boxed{number}."


class ArithData(vf.TaskData):
    answer: str


class CalcToolset(vf.Toolset[vf.ToolsetConfig]):
    """Two calculator tools; verifiers serves them as `calc_add` and `calc_multiply`."""

    TOOL_PREFIX = "calc"

    @vf.tool
    def add(self, a: float, b: float) -> float:
        """Add two numbers.

        Args:
            a: The first term.
            b: The second term.
        """
        return a + b

    @vf.tool
    def multiply(self, a: float, b: float) -> float:
        """Multiply two numbers.

        Args:
            a: The first factor.
            b: The second factor.
        """
        return a * b


class ArithTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class ArithTask(vf.Task[ArithData, vf.State, ArithTaskConfig]):
    @classmethod
    def toolsets(cls, config: ArithTaskConfig) -> list[vf.Toolset]:
        return [CalcToolset(config.tools)]

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        """1 when the last \\boxed{} of the reply is the answer, else 0."""
        return float(vf.extract_boxed_answer(trace.last_reply, strict=True).strip() == self.data.answer)


class ArithConfig(vf.TasksetConfig):
    task: ArithTaskConfig = ArithTaskConfig()


class ArithTaskset(vf.Taskset[ArithTask, ArithConfig]):
    def load(self) -> list[ArithTask]:
        return [
            ArithTask(
                ArithData(id=f"arith-{i}", prompt=q, answer=a, system_prompt=SYSTEM_PROMPT), self.config.task
            )
            for i, (q, a) in enumerate(QUESTIONS)
        ]
