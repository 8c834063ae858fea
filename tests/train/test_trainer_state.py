"""The resume contract (`tirl.train.checkpoint.Resumable`) in one process: a trainer saved by `save_trainer` and put
back by `restore_trainer` continues exactly; state a trainer adds travels with it; the rank split and micro-batch
loop of `tirl.train.dist` / `tirl.train.fsdp` in one process; `tirl.models` never imports `tirl.train`.

The kill-and-resume runs of the CLI (one and two processes) are in test_resume.py, test_lora_resume.py and
test_dist.py.
"""

from __future__ import annotations

import ast
import random
from pathlib import Path
from typing import Any

import torch

from conftest import make_model
from tirl.train import checkpoint, checkpoint_read, checkpoint_write, dist, manifest, rng, run_outputs
from tirl.train.batch import collate, micro_batches
from tirl.train.fsdp import MicroBatchPasses
from tirl.train.optim import OptimConfig
from tirl.train.sft import SFTConfig, SFTTrainer, sft_run

SRC = Path(__file__).resolve().parents[2] / "src" / "tirl"


class Recorder:
    """A metrics logger that keeps what it is given."""

    run_id = None

    def __init__(self) -> None:
        self.rows: list[tuple[int, dict[str, float]]] = []

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.rows.append((step, dict(metrics)))


class WithQueue(SFTTrainer):
    """An SFT trainer with one more piece of state, as a trainer that keeps a batch in flight would have."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.queue: list[int] = []

    def step(self, step: int) -> dict[str, float]:
        self.queue.append(step)
        return super().step(step)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "queue": list(self.queue)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.queue = list(state["queue"])


def _rows() -> list[dict[str, Any]]:
    return [
        {
            "messages": [
                {"role": "user", "content": f"Say {d}."},
                {"role": "assistant", "content": f"{d} it is."},
            ]
        }
        for d in range(12)
    ]


def _trainer(tokenizer, renderer, out: Path | None, cls=SFTTrainer) -> SFTTrainer:
    cfg = SFTConfig(epochs=2, batch_size=4, save_every=2, micro_batch_size=3, optim=OptimConfig(lr=0.003))
    model = make_model(tokenizer)
    return cls(
        sft_run(
            model,
            renderer,
            _rows(),
            cfg,
            pad_id=tokenizer.pad_token_id,
            seed=7,
            logger=Recorder(),
            out_dir=out,
        )
    )


def test_sft_trainer_restored_from_its_checkpoint_continues_exactly(tokenizer, renderer, tmp_path):
    full = _trainer(tokenizer, renderer, tmp_path / "full", cls=WithQueue)
    full.train()
    assert [p.name for p in run_outputs.complete_checkpoints(tmp_path / "full")] == [
        "checkpoint-2",
        "checkpoint-4",
        "checkpoint-6",
    ]
    random.seed(123)  # global generators elsewhere: the checkpoint's must come back
    torch.manual_seed(123)
    resumed = _trainer(tokenizer, renderer, tmp_path / "resumed", cls=WithQueue)
    state = checkpoint.restore_trainer(resumed, tmp_path / "full" / "checkpoint-4")
    assert state["step"] == resumed.step_done == 4
    assert resumed.queue == [0, 1, 2, 3]  # the added entry came back with the rest
    assert "optimizer" in state and "optimizer" not in resumed.state_dict()  # the checkpoint owns it
    resumed.train()
    assert resumed.run.logger.rows == full.run.logger.rows[4:]  # every metric of steps 4 and 5, to the bit
    assert resumed.queue == full.queue
    for (name, a), b in zip(
        full.model.state_dict().items(), resumed.model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name
    assert resumed.optimizer.state_dict()["state"].keys() == full.optimizer.state_dict()["state"].keys()


def test_trainer_without_out_dir_writes_nothing(tokenizer, renderer, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    trainer = _trainer(tokenizer, renderer, None)
    trainer.train()
    assert trainer.step_done == len(trainer.plan) == 6 and not list(tmp_path.iterdir())


def test_a_rank_missing_from_a_sharded_checkpoint_drops_the_entries_it_recorded(tokenizer, tmp_path):
    """A sharded checkpoint records which entries were each rank's own; a rank the saving run did not have
    keeps its own seeded ones (here: rank 0 with its rank file removed)."""
    path = tmp_path / "checkpoint-1"
    (path / checkpoint_write.DCP_DIR).mkdir(parents=True)
    (path / checkpoint_write.DCP_DIR / ".metadata").write_bytes(b"x")
    own = {"rng": rng.rng_state(), "generator": "rank 0's", "queue": [5]}
    shared = {"step": 1, **own, checkpoint_write.RANK_KEYS: ["rng", "generator", "queue"], "counter": 3}
    torch.save(shared, path / checkpoint_write.STATE)
    torch.save(own, path / "rank-0.pt")
    manifest.write(path, None)
    state = checkpoint_read.load_state(path)
    assert state["queue"] == [5] and state["generator"] == "rank 0's" and state["counter"] == 3
    (path / "rank-0.pt").unlink()
    (path / manifest.MANIFEST).unlink()
    manifest.write(path, None)
    state = checkpoint_read.load_state(path)
    assert "queue" not in state and "generator" not in state
    assert state["counter"] == 3 and "rng" in state  # rank 0's global generators are the fallback


def test_one_process_takes_all_work_and_the_plain_micro_batches(tokenizer):
    assert dist.rank_share([3, 1, 2]) == [3, 1, 2]
    model = make_model(tokenizer)
    ids = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [1]]
    batch = collate(ids, [[0, 1, 1], [0, 1], [0, 0, 0, 0], [0]], pad_id=tokenizer.pad_token_id)
    passes = MicroBatchPasses(model, batch, max_seqs=2)
    got = [(rows, micro.input_ids.shape[0]) for rows, micro in passes]
    assert got == [([0, 1], 2), ([2, 3], 2)]  # a micro-batch without trained tokens still runs here
    assert len(passes) == 2 and [r for r, _ in got] == micro_batches([3, 2, 4, 1], max_seqs=2)
    assert len(MicroBatchPasses(model, None)) == 0


def test_models_never_import_train():
    """The vLLM disk sync runs rollout -> models; a sharded model is gathered on the train side."""
    offenders = []
    for f in (SRC / "models").rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            offenders += [f"{f.name}: {n}" for n in names if n == "tirl.train" or n.startswith("tirl.train.")]
    assert offenders == []
