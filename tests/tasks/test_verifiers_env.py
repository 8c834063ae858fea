"""`task=verifiers:ENV` loads a verifiers environment as a tirl task: its tasks become rows split by a seed, its
`vf.Toolset` tools function tools, its `@vf.reward`s the verifier (full marks +1 and correct, partial credit
between -1 and +1), and what tirl cannot run is refused at load naming it. The environments are modules these
tests write and put on sys.path, as an installed environment would be importable."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("verifiers.v1")

from tirl.chat.tool_formats.hermes import call_json, parse_tool_calls  # noqa: E402
from tirl.commands.run_config import TirlConfig  # noqa: E402
from tirl.core.config import load_config  # noqa: E402
from tirl.data.records import ProblemRow  # noqa: E402
from tirl.rewards.scoring import Response, grade_responses  # noqa: E402
from tirl.rewards.shaping import RewardConfig  # noqa: E402
from tirl.tasks import load_task  # noqa: E402
from tirl.tasks.verifiers_env.load import require_verifiers  # noqa: E402

ENV = "tirl-vf-arith"  # verifiers imports it as the module tirl_vf_arith
SPEC = f"verifiers:{ENV}"
SYSTEM = "Answer as \\boxed{number}."
ARITH = f'''
"""Five sums and products, a calculator toolset, and two rewards: the right box (weight 1), any box (0.5)."""
import verifiers.v1 as vf

QUESTIONS = [("What is 2 + 3?", "5"), ("What is 7 * 6?", "42"), ("What is 9 - 4?", "5"),
             ("What is 12 * 12?", "144"), ("What is 100 + 1?", "101")]


class ArithData(vf.TaskData):
    answer: str


class CalcToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = "calc"

    @vf.tool
    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: The first factor.
            b: The second factor.
        """
        return a * b

    @vf.tool
    async def add(self, a: float, b: float = 1.0) -> float:
        """Add two numbers.

        Args:
            a: The first term.
            b: The second term.
        """
        return a + b


class ArithTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class ArithTask(vf.Task[ArithData, vf.State, ArithTaskConfig]):
    @classmethod
    def toolsets(cls, config):
        return [CalcToolset(config.tools)]

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return float(vf.extract_boxed_answer(trace.last_reply, strict=True) == self.data.answer)

    @vf.reward(weight=0.5)
    async def boxed(self, trace: vf.Trace) -> float:
        return float(bool(vf.extract_boxed_answer(trace.last_reply, strict=True)))


class ArithConfig(vf.TasksetConfig):
    task: ArithTaskConfig = ArithTaskConfig()


class ArithTaskset(vf.Taskset[ArithTask, ArithConfig]):
    def load(self):
        for i, (q, a) in enumerate(QUESTIONS):
            data = ArithData(id=f"q{{i}}", prompt=q, answer=a, system_prompt={SYSTEM!r})
            yield ArithTask(data, self.config.task)


__all__ = ["ArithTaskset"]
'''

# Environments tirl refuses, each built on the one above: (module, its source, what the error must say)
REFUSED = [
    ("tirl_vf_box", "runtime", "rewards in_box take `runtime`"),
    ("tirl_vf_setup", "setup", "Task.setup prepares a verifiers runtime"),
    ("tirl_vf_judge", "judge", "task config holds a judge (grader): a judge asks a model"),
    ("tirl_vf_docker", "docker", "CalcToolset: it asks for the docker runtime"),
    ("tirl_vf_state", "state", "Stateful: it keeps rollout state"),
]
VARIANTS = {
    "runtime": """
class Task2(ArithTask):
    @vf.reward
    async def in_box(self, trace, runtime) -> float:
        return 1.0
""",
    "setup": """
class Task2(ArithTask):
    async def setup(self, trace, runtime):
        await runtime.write("/tmp/x", b"")
""",
    "judge": """
class Config2(ArithTaskConfig):
    grader: vf.JudgeConfig = vf.JudgeConfig()


class Task2(vf.Task[ArithData, vf.State, Config2]):
    @vf.reward
    async def correct(self, trace) -> float:
        return 1.0
""",
    "docker": """
class Task2(ArithTask):
    @classmethod
    def toolsets(cls, config):
        return [CalcToolset(vf.ToolsetConfig(runtime=vf.DockerConfig()))]
""",
    "state": """
class Counted(vf.State):
    calls: int = 0


class Stateful(vf.Toolset[vf.ToolsetConfig, Counted]):
    @vf.tool
    def count(self) -> int:
        '''Count the calls.'''
        self.state.calls += 1
        return self.state.calls


class Task2(ArithTask):
    @classmethod
    def toolsets(cls, config):
        return [Stateful(config.tools)]
""",
}
TASKSET2 = """

class Taskset2(vf.Taskset[Task2, vf.TasksetConfig]):
    def load(self):
        yield Task2(ArithData(prompt="What is 1 + 1?", answer="2"))  # the task's own config type


__all__ = ["Taskset2"]
"""


@pytest.fixture
def envs(tmp_path, monkeypatch):
    """The environments above as modules on sys.path."""
    (tmp_path / "tirl_vf_arith.py").write_text(ARITH)
    imports = (
        "import verifiers.v1 as vf\n"
        "from tirl_vf_arith import ArithData, ArithTask, ArithTaskConfig, CalcToolset\n"
    )
    for module, variant, _ in REFUSED:
        (tmp_path / f"{module}.py").write_text(imports + VARIANTS[variant] + TASKSET2)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _cfg(*overrides: str) -> TirlConfig:
    return load_config(TirlConfig, None, [f"task.name={SPEC}", *overrides])


def test_rows_are_the_tasks_split_by_the_seed_with_their_prompts_and_data(envs):
    task, cfg = load_task(SPEC), _cfg()
    train, test = task.load_rows("train", cfg.task, cfg.seed), task.load_rows("test", cfg.task, cfg.seed)
    assert len(test) == 1 and len(train) == 4  # a fifth held out, round(5 * 0.2)
    assert sorted(r["extra_info"]["id"] for r in train + test) == ["q0", "q1", "q2", "q3", "q4"]
    row = next(r for r in train + test if r["extra_info"]["id"] == "q1")
    assert row["data_source"] == SPEC and row["extra_info"]["idx"] == 1
    assert row["prompt"] == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What is 7 * 6?"},
    ]
    data = json.loads(row["reward_model"]["ground_truth"])
    assert data["answer"] == "42" and data["prompt"] == "What is 7 * 6?"
    # the same split seed, the same split; another seed draws another test task among the five
    again = task.load_rows("test", _cfg("seed=0").task, 0)
    assert again == test
    held_out = {task.load_rows("test", cfg.task, s)[0]["extra_info"]["id"] for s in range(12)}
    assert len(held_out) > 1
    fixed = _cfg("seed=5", "task.split_seed=0").task
    assert task.load_rows("test", fixed, 5) == task.load_rows("test", cfg.task, 0)


def test_test_fraction_and_max_tasks_size_the_split(envs):
    task = load_task(SPEC)
    half = _cfg("task.test_fraction=0.5", "task.max_tasks=4").task
    assert len(task.load_rows("test", half, 0)) == 2 and len(task.load_rows("train", half, 0)) == 2
    ids = {r["extra_info"]["id"] for s in ("train", "test") for r in task.load_rows(s, half, 0)}
    assert ids == {"q0", "q1", "q2", "q3"}  # the taskset's first four
    with pytest.raises(ValueError, match="task.test_fraction"):
        _cfg("task.test_fraction=1.0")


def test_the_toolsets_tools_have_verifiers_names_and_schemas_and_run(envs):
    task = load_task(SPEC)
    assert [(t.name, t.sandbox) for t in task.tools] == [("calc_add", False), ("calc_multiply", False)]
    add = task.tools[0].schema["function"]
    assert add["description"] == "Add two numbers."
    assert add["parameters"] == {
        "type": "object",
        "properties": {
            "a": {"type": "number", "description": "The first term."},
            "b": {"type": "number", "description": "The second term."},
        },
        "required": ["a"],
    }
    text = "".join(
        f"<tool_call>\n{call_json(name, args)}\n</tool_call>"
        for name, args in (
            ("calc_multiply", {"a": 7, "b": 6}),
            ("calc_add", {"a": 2.5}),
            ("calc_add", {"x": 1}),
        )
    )
    out = task.toolset().execute(parse_tool_calls(text), None)
    assert [(o.status, o.text) for o in out] == [
        ("ok", "42"),
        ("ok", "3.5"),  # the async method, awaited; b's default
        ("parse_error", "Error: bad arguments for tool 'calc_add': unknown argument 'x' (valid: a, b); "
                        "missing required argument 'a'."),
    ]  # fmt: skip


def _grade(responses: list[str], answer_id: str = "q1"):
    task, cfg = load_task(SPEC), _cfg()
    rows = task.load_rows("train", cfg.task, cfg.seed) + task.load_rows("test", cfg.task, cfg.seed)
    row = next(r for r in rows if r["extra_info"]["id"] == answer_id)
    problem = ProblemRow.from_row(row, 0)
    return grade_responses([Response(r, problem) for r in responses], RewardConfig())


def test_the_rewards_grade_a_right_and_a_wrong_answer(envs):
    right, wrong, unboxed = _grade(["7 * 6 = \\boxed{42}", "\\boxed{41}", "42"])
    assert (right.score, right.correct) == (1.0, True)  # 1 * 1 + 0.5 * 1 = 1.5 of 1.5
    assert right.details["rewards"] == {"correct": 1.0, "boxed": 1.0}
    # 0.5 of 1.5: partial credit, a third of the way from -1 to +1, and not correct
    assert (wrong.correct, wrong.details["reward"]) == (False, 0.5)
    assert wrong.score == pytest.approx(-1 / 3)
    assert (unboxed.score, unboxed.correct) == (-1.0, False)


def test_ground_truth_that_is_not_the_tasks_data_grades_as_an_error(envs):
    load_task(SPEC)
    problem = ProblemRow("p", SPEC, [{"role": "user", "content": "q"}], '{"answer": 5}')
    (g,) = grade_responses([Response("\\boxed{5}", problem)], RewardConfig())
    assert g.score == -1.0 and "ground truth is not verifiers:tirl-vf-arith task data" in g.details["error"]


@pytest.mark.parametrize(("module", "said"), [(m, s) for m, _, s in REFUSED])
def test_what_tirl_cannot_run_is_refused_at_load_naming_it(envs, module, said):
    with pytest.raises(ValueError, match=f"task 'verifiers:{module}'") as e:
        load_task(f"verifiers:{module}")
    assert said in str(e.value)


def test_a_bad_env_name_says_what_verifiers_tried(envs):
    with pytest.raises(ValueError) as e:
        load_task("verifiers:no-such-env")
    said = str(e.value)
    assert "task 'verifiers:no-such-env': verifiers cannot load environment 'no-such-env'" in said
    assert "tried to import 'no_such_env'" in said
    with pytest.raises(ValueError, match="names no environment"):
        load_task("verifiers:")


def test_without_verifiers_the_error_says_how_to_install_it(monkeypatch):
    installed = sys.modules["verifiers"]
    monkeypatch.delitem(sys.modules, "verifiers.v1")
    monkeypatch.setitem(sys.modules, "verifiers", None)
    with pytest.raises(ValueError, match=r"needs the verifiers package: pip install 'tirl\[verifiers\]'"):
        require_verifiers()
    monkeypatch.setitem(sys.modules, "verifiers", installed)
    monkeypatch.setitem(sys.modules, "verifiers.v1", None)  # a verifiers before 0.4: no v1 API
    with pytest.raises(ValueError, match=r"needs verifiers >= 0.4 \(its v1 API\)"):
        require_verifiers()


def test_tirl_tasks_imports_without_verifiers_and_names_the_source():
    code = textwrap.dedent("""
        import sys
        sys.modules["verifiers"] = None
        from tirl.tasks import load_task
        load_task("arith")
        try:
            load_task("nosuch")
        except ValueError as e:
            print(e)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("math500, verifiers:ENV or package.module:attribute")


@pytest.mark.slow  # ~10 s on 2 CPU cores (verifiers' import, tokenizer, model, 2 RL steps)
def test_tirl_rl_trains_two_steps_on_the_verifiers_task(envs, tmp_path):
    from tirl.chat.template import conversation_text
    from tirl.commands.args import load_run_config
    from tirl.commands.stages import build_renderer, run_rl
    from tirl.models.tiny import TinyModelConfig, build_tiny

    class Args:
        config, command = None, "rl"
        overrides = [
            f"task={SPEC}", "rl.steps=2", "rl.prompts_per_step=2", "rl.n=2", "rl.mini_batch_size=4",
            "agent.max_response_tokens=24", "agent.max_tokens_per_turn=24", "logging.backends=[jsonl]",
            "sandbox.max_workers=1", "threads=1",
        ]  # fmt: skip

    cfg = load_run_config(Args)
    task = load_task(SPEC)
    rows = task.load_rows("train", cfg.task, cfg.seed) + task.load_rows("test", cfg.task, cfg.seed)
    texts = [
        conversation_text(r["prompt"], add_generation_prompt=True) + "\\boxed{42} <tool_call>" for r in rows
    ]
    shape = TinyModelConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                            num_kv_heads=2)  # fmt: skip
    model = build_tiny(tmp_path / "model-init", texts, shape, seed=0)
    out = run_rl(cfg, tmp_path / "rl", model_path=model)
    assert (out / "config.json").is_file()
    steps = [json.loads(line) for line in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == 2 and all("reward/mean" in s for s in steps)
    # each step re-rendered every trajectory and found the ids and loss mask the engine sampled (else it raises)
    assert all(s["rollout/retokenized_turn_share"] >= 0.0 for s in steps)
    assert all(-1.0 <= s["reward/mean"] <= 1.0 for s in steps)  # the environment's rewards on tirl's scale
    # the toolset's tools are what the model is told about (Qwen formats list them in the system turn)
    qwen = load_config(TirlConfig, None, [f"task.name={SPEC}", "chat.format=qwen2.5"])
    from transformers import AutoTokenizer

    text = build_renderer(AutoTokenizer.from_pretrained(model), qwen).text([{"role": "user", "content": "q"}])
    assert all(json.dumps(t.schema, ensure_ascii=False) in text for t in task.tools)


def test_the_example_environment_loads_grades_and_lists_its_tools(monkeypatch):
    """examples/verifiers_env/verifiers_arith, as its docstring runs it (its directory on the import path)."""
    from pathlib import Path

    from tirl.rewards.scoring import Response, grade_responses
    from tirl.tasks import load_task

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "examples" / "verifiers_env"))
    task = load_task("verifiers:verifiers-arith")
    options = task.options()
    train, test = task.rows("train", options, 0), task.rows("test", options, 0)
    assert len(train) + len(test) == 12 and len(test) >= 1
    assert sorted(t.name for t in task.tools) == ["calc_add", "calc_multiply"]
    row = ProblemRow.from_row(test[0], 0)
    answer = json.loads(row.ground_truth)["answer"] if isinstance(row.ground_truth, str) else None
    right = Response(f"\\boxed{{{answer}}}", row, 0, 10)
    wrong = Response("\\boxed{-7}", row, 0, 10)
    from tirl.rewards.shaping import RewardConfig

    graded = grade_responses([right, wrong], RewardConfig())
    assert [g.correct for g in graded] == [True, False]
