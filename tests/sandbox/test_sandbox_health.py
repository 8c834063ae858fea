"""A broken sandbox stops `tirl rl` / `tirl eval` with a clear error: at start-up, and when a step's every call fails.

Only the sandbox's own failures count (status sandbox_error); the model's exceptions and timeouts never stop a run.
"""

from __future__ import annotations

import pytest
import torch
from fusion_server import FusionServer
from test_sandbox_service import TOKEN

from conftest import make_agent, make_model
from tirl.cli import main
from tirl.eval.evaluate import EvalConfig, evaluate
from tirl.rewards.shaping import RewardConfig
from tirl.rollout.agent.loop import AgentConfig, AgentLoop
from tirl.rollout.engines.base import RemoteModel
from tirl.rollout.engines.torch.engine import Generation
from tirl.rollout.sampling import SamplingParams
from tirl.rollout.types import ToolCallRecord, Trajectory
from tirl.sandbox import SandboxClient, SandboxConfig
from tirl.sandbox.auth import TOKEN_ENV
from tirl.sandbox.health import SandboxBroken, check_sandbox, raise_if_sandbox_down
from tirl.train.optim import OptimConfig
from tirl.train.rl.run import assemble
from tirl.train.rl.trainer import RLConfig, RLTrainer

DEAD = "http://127.0.0.1:1"  # nothing listens on port 1: connection refused at once


def remote(*urls: str, **kw: object) -> SandboxConfig:
    return SandboxConfig(backend="remote", urls=urls, retries=0, **kw)


def test_startup_check_names_the_dead_url_and_what_to_do() -> None:
    with pytest.raises(SandboxBroken) as e:
        check_sandbox(remote(DEAD))
    msg = str(e.value)
    assert f"start-up check of the sandbox.urls {DEAD} failed" in msg and "ConnectError" in msg
    assert "tirl sandbox serve" in msg and "sandbox.backend=local" in msg


def test_startup_check_passes_on_a_working_local_sandbox() -> None:
    check_sandbox(SandboxConfig(max_workers=1, preload_heavy=()))


def test_startup_check_tries_each_url_and_sends_the_token(monkeypatch: pytest.MonkeyPatch) -> None:
    srv = FusionServer("--workers", "1", "sandbox.isolation=none", "sandbox.preload_heavy=[]", token=TOKEN)
    try:
        monkeypatch.setenv(TOKEN_ENV, TOKEN)
        check_sandbox(remote(srv.url))
        with pytest.raises(SandboxBroken, match=f"sandbox.urls {DEAD} failed"):
            check_sandbox(remote(srv.url, DEAD))
        monkeypatch.setenv(TOKEN_ENV, "not-the-servers-token-123")
        with pytest.raises(SandboxBroken, match=f"sandbox.urls {srv.url} failed: .*HTTP 401"):
            check_sandbox(remote(srv.url))
    finally:
        srv.close()


@pytest.mark.parametrize("command", ["eval", "rl"])
def test_cli_fails_before_loading_the_model(command: str, tmp_path, capsys) -> None:
    """No model directory exists: the sandbox error proves the check ran before the model was touched."""
    args = [command, f"model.path={tmp_path / 'no-model'}", f"out_dir={tmp_path}"]
    args += ["sandbox.backend=remote", f"sandbox.urls=[{DEAD}]", "sandbox.retries=0"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "start-up check of the sandbox.urls" in err and "Traceback" not in err, err


def _traj(statuses: list[str]) -> Trajectory:
    calls = [
        ToolCallRecord(
            1, "print(1)", "x", s, {"status": s, "sandbox_error": "refused" if s == "sandbox_error" else None}
        )
        for s in statuses
    ]
    return Trajectory([1], [2], [1], [0.0], ["a"], calls, "answer")


def test_stop_rule_counts_only_the_sandboxs_own_failures() -> None:
    results = lambda trajs: (c.exec_result for t in trajs for c in t.tool_calls if c.exec_result)  # noqa: E731
    raise_if_sandbox_down(results([_traj([]), _traj([])]), "step 0")  # no call: nothing to judge
    raise_if_sandbox_down(results([_traj(["sandbox_error"]), _traj(["ok"])]), "step 0")  # one got through
    raise_if_sandbox_down(results([_traj(["runtime_error", "timeout", "memory_exceeded"])]), "step 0")
    with pytest.raises(
        SandboxBroken, match=r"step 3: all 3 sandbox calls failed in the sandbox itself, .*refused"
    ):
        raise_if_sandbox_down(
            results([_traj(["sandbox_error", "sandbox_error"]), _traj(["sandbox_error"])]), "step 3"
        )


class CallThenAnswer(RemoteModel):
    """Every prompt makes one code_interpreter call, then answers."""

    def __init__(self, renderer, code: str) -> None:
        self.renderer, self.code, self.turn = renderer, code, 0

    def generate(self, prompts, params, *, max_new_tokens=None, generator=None):
        from tirl.tools.code_interpreter import tool_call_json

        self.turn += 1
        text = f"<tool_call>\n{tool_call_json(self.code)}\n</tool_call>" if self.turn == 1 else "\\boxed{1}"
        ids = self.renderer.encode(text)
        ids = ids if self.turn == 1 else ids + [self.renderer.eos_id]
        return [Generation(ids, [-0.5] * len(ids), "stop" if self.turn == 1 else "eos") for _ in prompts]


ROWS = [{"prompt": [{"role": "user", "content": "What is 0 + 1?"}], "reward_model": {"ground_truth": "1"}}]


def test_eval_stops_when_every_call_of_a_batch_fails_in_the_sandbox(renderer, sandbox) -> None:
    cfg = EvalConfig(n=2)
    with SandboxClient(remote(DEAD)) as dead:
        agent = AgentLoop(CallThenAnswer(renderer, "print(1)"), renderer, dead, AgentConfig())
        with pytest.raises(SandboxBroken, match=r"eval m, problems 1-1: all 2 sandbox calls failed"):
            evaluate(agent, ROWS, cfg, model_label="m", seed=0)
    agent = AgentLoop(CallThenAnswer(renderer, "raise SystemExit(3)"), renderer, sandbox, AgentConfig())
    records, _ = evaluate(agent, ROWS, cfg, model_label="m", seed=0)  # the model's own failures: no stop
    assert [r.num_tool_errors for r in records] == [1, 1]


def test_rl_rollout_stops_when_every_call_fails_in_the_sandbox(tokenizer, renderer, tmp_path) -> None:
    torch.manual_seed(0)
    with SandboxClient(remote(DEAD)) as dead:
        agent = make_agent(make_model(tokenizer), renderer, dead, max_tokens=12)
        cfg = RLConfig(steps=1, prompts_per_step=1, n=2, mini_batch_size=2, optim=OptimConfig(lr=1e-3))
        trainer = RLTrainer(assemble(
            agent.engine.model, tokenizer, agent, ROWS, cfg, sampling=SamplingParams(), reward=RewardConfig(),
            out_dir=tmp_path, seed=0,
        ))  # fmt: skip
        failing = [_traj(["sandbox_error"]), _traj(["sandbox_error", "sandbox_error"])]
        # as if the sampled turns had called the tool and the sandbox had refused each call
        agent.run = lambda *a, **k: failing
        with pytest.raises(
            SandboxBroken, match=r"RL step 0: all 3 sandbox calls failed in the sandbox itself"
        ):
            trainer.train()
