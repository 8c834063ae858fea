"""The real trajectories of the `data` comparison (`tirl compare --preset data`, `tirl demo --model smollm2 --task
gsm8k --compare data`): do real end-to-end trajectories beat stitched ones?

The stitched-SFT model samples `SAMPLE_N` tool-using trajectories per problem of the task's sample pool (the SFT
problems first, then other train problems; never an RL or test problem) at the rollout temperature, with the real
sandbox; the verified-correct ones are kept (one per problem, `tirl data sample`'s selection and token check) until
there are as many as stitched SFT rows, or `SAMPLE_MAX_PROBLEMS_PER_ROW` x that many problems were tried. Why the
stitched-SFT model and not the base: the base never calls the tool in this format (GSM8K base evaluation: no tool
call), so it has no correct tool trajectories to give; the stitched-SFT model is the first model that has.

The comparison's arm `real` then trains SFT from the base on those rows with the stitched SFT's settings
(`sft-real`), evaluated as the stitched SFT is (`tirl.demo.ablation.starts.SmolLM2Starts.data_start`). Not here: the
arms, their training and evaluation (`tirl.demo.ablation`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from tirl.core.io import atomic_write_json
from tirl.core.logging import console
from tirl.data import read_rows, write_rows
from tirl.demo.stages import SAMPLE_KEYS, Stage, Stages, config_inputs, rows_input

SAMPLE_N = 4  # samples per problem
SAMPLE_MAX_PROBLEMS_PER_ROW = 2  # problems tried per wanted row at most: the sampling budget
SAMPLE_CHUNK = 64  # problems sampled between checks of the count


def _merge(total: dict[str, Any], part: dict[str, Any]) -> None:
    for k, v in part.items():
        if isinstance(v, int) and not isinstance(v, bool):
            total[k] = total.get(k, 0) + v
        elif isinstance(v, dict):
            total.setdefault(k, {}).update(v)
        elif isinstance(v, list):
            total.setdefault(k, []).extend(v)


@dataclasses.dataclass(frozen=True)
class Progress:
    """The sampling done so far, saved after each chunk so that a stopped run goes on from the next chunk instead
    of sampling an hour again. Each chunk's seed is fixed by its start, so going on gives the rows an unbroken run
    gives. Used only when made from the same inputs as the stage."""

    path: Path
    inputs: dict[str, str]

    def load(self) -> tuple[int, list[dict[str, Any]], dict[str, Any]]:
        """(the next problem to sample, the rows kept, the summary counts); (0, [], {}) when nothing usable."""
        try:
            saved = json.loads(self.path.read_text(encoding="utf-8"))
            if saved["inputs"] == self.inputs:
                return int(saved["next"]), list(saved["kept"]), dict(saved["stats"])
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError) as e:
            console.print(f"[yellow]sample: ignoring {self.path} ({type(e).__name__}: {e}); starting over[/]")
        return 0, [], {}

    def save(self, next_problem: int, kept: list[dict[str, Any]], stats: dict[str, Any]) -> None:
        atomic_write_json(
            self.path,
            {"inputs": self.inputs, "next": next_problem, "kept": kept, "stats": stats},
            indent=None,
        )

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)


def _settings_inputs(n: int, max_problems: int | None, keep_retokenized: bool) -> dict[str, str]:
    """The sampling settings as stage inputs, each only when set otherwise than the demo sets it, so the demo's
    sampled rows keep their fingerprint."""
    return {
        **({"samples per problem": str(n)} if n != SAMPLE_N else {}),
        **({"problems tried": str(max_problems)} if max_problems is not None else {}),
        **({"keep retokenized": "yes"} if keep_retokenized else {}),
    }


def _sample_chunks(
    run: Stages, pool: list[dict[str, Any]], want: int, scfg: Any, progress: Progress
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Model `sft`'s kept rows and summary counts over `pool`, `SAMPLE_CHUNK` problems at a time until `want` rows,
    going on from `progress` and saving it after each chunk."""
    from tirl.commands.stages import eval_reward, inference_agent
    from tirl.eval.rejection_sampling import sample_rows
    from tirl.rollout.sampling import SamplingParams

    cfg, model = run.cfg, run.models["sft"].path
    params = SamplingParams(temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p)
    start, kept, stats = progress.load()
    console.print(
        f"[bold]sample[/]: {model} samples {scfg.n} trajectories per problem at T={params.temperature} until "
        f"{want} problems have a correct one (at most {len(pool)} problems)"
        + (f"; continuing after {start} problems ({len(kept)} rows)" if start else "")
    )
    if start >= len(pool) or len(kept) >= want:
        return kept, stats
    with inference_agent(cfg, model, run.out / "sample") as agent:
        for s in range(start, len(pool), SAMPLE_CHUNK):
            rows, part = sample_rows(
                agent, pool[s : s + SAMPLE_CHUNK], scfg, params=params, reward=eval_reward(cfg),
                seed=cfg.seed + s, batch_problems=cfg.eval.batch_problems,
            )  # fmt: skip
            kept += rows
            _merge(stats, part.summary())
            progress.save(s + SAMPLE_CHUNK, kept, stats)
            if len(kept) >= want:
                break
    return kept, stats


def sample_real_rows(
    run: Stages,
    pool: list[dict[str, Any]],
    want: int,
    n: int = SAMPLE_N,
    max_problems: int | None = None,
    keep_retokenized: bool = False,
) -> list[dict]:
    """Up to `want` verified-correct trajectories of model `sft` on `pool` (in order), `n` samples per problem,
    written to data/sft-real.jsonl with a summary beside it; reused when that file was sampled from the same
    inputs. `max_problems`: the problems tried at most (default `SAMPLE_MAX_PROBLEMS_PER_ROW` x `want`);
    `keep_retokenized`: `tirl data sample --keep-retokenized`."""
    from tirl.eval.rejection_sampling import SampleConfig, summary_path

    cfg, out, model = run.cfg, run.out, run.models["sft"]
    path = out / "data" / "sft-real.jsonl"
    inputs = {
        **config_inputs(cfg, SAMPLE_KEYS),
        "model sft": model.fingerprint,
        **rows_input("sample pool", pool),
        "wanted rows": str(want),
        **_settings_inputs(n, max_problems, keep_retokenized),
    }
    stage = Stage("sample", path, inputs)
    if stage.reusable(path.is_file()):
        return read_rows(path)
    scfg = SampleConfig(n=n, keep=1, keep_retokenized=keep_retokenized)
    limit = min(len(pool), SAMPLE_MAX_PROBLEMS_PER_ROW * want if max_problems is None else max_problems)
    progress = Progress(path.with_name(f"{path.stem}.progress.json"), inputs)
    kept, stats = _sample_chunks(run, pool[:limit], want, scfg, progress)
    kept = kept[:want]
    write_rows(path, kept)
    stats.update(
        rows_written=len(kept), wanted=want, settings={**dataclasses.asdict(scfg), "model": str(model.path)}
    )
    atomic_write_json(summary_path(path), stats)
    stage.record()
    progress.clear()
    console.print(
        f"{stats.get('samples', 0)} samples of {stats.get('problems', 0)} problems: {len(kept)} rows kept"
    )
    return kept
