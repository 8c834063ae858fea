"""A rollout engine over any server speaking the OpenAI `/v1/completions` API (vLLM, SGLang, TGI, hosted).

Token-in/token-out: the prompt goes as a list of token ids, and the sampled ids and their log-probs come back
through vLLM's `return_token_ids: true` and `logprobs: 0` (the sampled token's log-prob only). A server that
answers with text only is refused: re-tokenizing text would not give the ids that were sampled. Requests go to
the URLs round-robin over one pooled httpx client, at most `concurrency` at once (a thread pool), each retried with
exponential back-off on connection errors and 5xx/429 answers. `check()` compares `/v1/models` with the model name
and the server's vocabulary with the tokenizer's (a probe `/detokenize` where the server has it), so a wrong server
fails at start-up, not as garbage rollouts.

Weights: this engine cannot push new weights to a generic server, so `sync_weights` raises; RL with it is refused
at start-up (its capabilities say `weight_sync="none"`). Evaluation needs no sync. Every request passes the engine's
`gate` (`tirl.rollout.engines.gate`), which a subclass's sync closes; with `gate.interrupt` on (partial rollouts)
requests stream their tokens and go on across a sync from what they have (`tirl.rollout.engines.openai.partial`).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

from tirl.rollout.capabilities import EngineCapabilities
from tirl.rollout.engines.base import RemoteModel
from tirl.rollout.engines.gate import RequestGate
from tirl.rollout.sampling import SamplingParams, per_prompt_budgets
from tirl.rollout.timeouts import Throughput
from tirl.rollout.types import Generation

RETRY_STATUS = {429, 500, 502, 503, 504}
INTERRUPTED = ""  # a streamed request's finish reason when a sync interrupted it


class EngineError(RuntimeError):
    """The server is unreachable, misconfigured, or answered something this engine cannot use."""


class EngineGone(EngineError):
    """The server's process has exited (an engine that manages it knows): retrying cannot help."""


def first_choice(reply: Any, where: str) -> dict[str, Any]:
    """The first choice of a completion (or of one streamed chunk); a reply without one (the error object a
    server sends when it aborts a request or shuts down) is an EngineError quoting it."""
    choices = reply.get("choices") if isinstance(reply, dict) else None
    if not choices or not isinstance(choices[0], dict):
        said = reply.get("error", reply) if isinstance(reply, dict) else reply
        raise EngineError(f"{where} answered without a completion: {str(said)[:500]}")
    return choices[0]


@dataclass
class OpenAIEngineConfig:
    urls: list[str]
    model: str
    concurrency: int = 16
    timeout_s: float = 120.0  # per request, on top of the budget's decode time (tirl.rollout.timeouts)
    min_tokens_per_s: float = 5.0  # decode rate assumed for one request before a slower one is measured
    retries: int = 3
    backoff_s: float = 0.5
    eos_ids: list[int] = field(default_factory=list)
    stop_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.urls:
            raise ValueError("the openai engine needs rollout.urls (one or more server base URLs)")
        if not self.model:
            raise ValueError("the openai engine needs rollout.model_name (the served model's name)")
        if self.concurrency < 1 or self.retries < 0 or self.timeout_s <= 0:
            raise ValueError("openai engine: concurrency >= 1, retries >= 0 and timeout_s > 0 required")


class OpenAIEngine(RemoteModel):
    """See the module docstring. Thread-safe: `generate` fans requests out over a pool.

    Log-probs are declared renormalized: a server may truncate before it reports them, and nothing here can tell.
    """

    capabilities = EngineCapabilities(
        name="openai", weight_sync="none", logprobs="renormalized", per_request_seeds=True, multi_process=False,
        batches_requests=True, sync_gate=True, partial_rollouts=True,
    )  # fmt: skip

    def __init__(self, cfg: OpenAIEngineConfig) -> None:
        self.cfg = cfg
        self.weight_version = 0
        self._urls = [u.rstrip("/") for u in cfg.urls]
        self._next = itertools.cycle(range(len(self._urls)))
        self._lock = threading.Lock()
        limits = httpx.Limits(max_connections=cfg.concurrency, max_keepalive_connections=cfg.concurrency)
        self._client = httpx.Client(timeout=cfg.timeout_s, limits=limits)
        self._pool = ThreadPoolExecutor(max_workers=cfg.concurrency, thread_name_prefix="tirl-openai")
        self.throughput = Throughput(cfg.min_tokens_per_s)
        self.gate = (
            RequestGate()
        )  # a sync (a subclass's) waits for the requests in flight, or interrupts them

    def _url(self) -> str:
        with self._lock:
            return self._urls[next(self._next)]

    def _request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        url: str | None = None,
        timeout: float | None = None,
    ) -> Any:
        """One call with retries and exponential back-off; the last failure becomes an EngineError. `timeout`:
        this call's limit in seconds (default `timeout_s`)."""
        last: str = ""
        for attempt in range(self.cfg.retries + 1):
            base = url or self._url()
            try:
                r = self._client.request(
                    method, base + path, json=body, timeout=timeout or self.cfg.timeout_s
                )
                if r.status_code in RETRY_STATUS:
                    last = f"{base}{path}: HTTP {r.status_code} {r.text[:200]}"
                elif r.status_code >= 400:
                    raise EngineError(f"{base}{path}: HTTP {r.status_code} {r.text[:500]}")
                else:
                    return r.json()
            except httpx.HTTPError as e:
                last = f"{base}{path}: {type(e).__name__}: {e}"
            if attempt < self.cfg.retries:
                time.sleep(self.cfg.backoff_s * 2**attempt)
        raise EngineError(f"request failed after {self.cfg.retries + 1} attempts: {last}")

    def check(self, tokenizer: Any | None = None) -> None:
        """Every server serves `model`, and (when the server can detokenize) with the tokenizer's vocabulary.

        The probe goes ids -> text (`/detokenize`), not text -> ids: this engine only ever sends and receives ids,
        so what must agree is what an id means. (A server may split text differently and still be right here: a
        transformers release that re-derives a tokenizer's pre-tokenizer from its model type does that.)"""
        for base in self._urls:
            names = [m.get("id") for m in self._request("GET", "/v1/models", url=base).get("data", [])]
            if self.cfg.model not in names:
                raise EngineError(f"{base} serves {names}, not rollout.model_name={self.cfg.model!r}")
            if tokenizer is None:
                continue
            ids = tokenizer.encode(
                "Hello, world! 12 + 30 = 42; def f(x): return x ** 2", add_special_tokens=False
            )
            want = tokenizer.decode(ids)
            try:
                r = self._client.post(base + "/detokenize", json={"model": self.cfg.model, "tokens": ids})
            except httpx.HTTPError:
                continue  # a server without /detokenize: the model-name check is all we can do
            if r.status_code == 200 and r.json().get("prompt") != want:
                raise EngineError(
                    f"{base}: the server's tokenizer disagrees with ours on a probe (ids {ids} are "
                    f"{r.json().get('prompt')!r} there, {want!r} here): wrong model for this tokenizer"
                )

    def body(
        self, prompt: Sequence[int], params: SamplingParams, budget: int, seed: int | None
    ) -> dict[str, Any]:
        """The `/v1/completions` request for one prompt: ids in, sampled ids and their log-probs out."""
        body: dict[str, Any] = {
            "model": self.cfg.model,
            "prompt": list(prompt),
            "max_tokens": budget,
            "temperature": params.temperature,
            "top_p": params.top_p,
            # always explicit: a vLLM server otherwise takes top_k from the model's generation_config.json
            "top_k": params.top_k if params.top_k > 0 else -1,
            "logprobs": 0,
            "return_token_ids": True,
            "stop_token_ids": [*self.cfg.eos_ids, *self.cfg.stop_ids],
            "skip_special_tokens": False,
            "include_stop_str_in_output": True,
        }
        if seed is not None:
            body["seed"] = seed
        return body

    def _one(
        self, prompt: Sequence[int], params: SamplingParams, budget: int, seed: int | None
    ) -> Generation:
        if self.gate.interrupt:  # partial rollouts: streamed, interrupted by a sync and continued after it
            return self._partial(prompt, params, budget, seed)
        with self.gate.request():
            t0 = time.monotonic()
            limit = self.throughput.limit(self.cfg.timeout_s, budget)
            choice = self._request(
                "POST", "/v1/completions", self.body(prompt, params, budget, seed), timeout=limit
            )
            gen = self._parse(first_choice(choice, "/v1/completions"), budget)
        self.throughput.observe(len(gen.token_ids), time.monotonic() - t0)
        return gen

    def _partial(
        self, prompt: Sequence[int], params: SamplingParams, budget: int, seed: int | None
    ) -> Generation:
        """One generation across weight syncs: streamed; a sync interrupts it (the response closed, so the server
        aborts the request), the tokens so far are kept with their log-probs and the version that sampled them, and
        it goes on from that prefix with the new weights. A connection that fails mid-stream keeps its tokens too and
        is retried from them (`retries`), so nothing is sampled twice or lost. A continuation is seeded with
        `seed + tokens kept`: the same request never repeats its random stream from the start."""
        ids: list[int] = []
        lps: list[float] = []
        versions: list[int] = []
        finish, failures = None, 0
        while finish is None and len(ids) < budget:
            with self.gate.request():
                version, before = self.weight_version, len(ids)
                resumed = None if seed is None else (seed + before) % 2**31
                body = self.body([*prompt, *ids], params, budget - before, resumed)
                try:
                    finish = self._stream_into(body, ids, lps, budget - before)
                    why = "the stream ended without a finish reason"
                except EngineGone:
                    raise
                except (httpx.HTTPError, EngineError) as e:
                    why = f"{type(e).__name__}: {e}"
            versions += [version] * (len(ids) - before)
            if finish == INTERRUPTED:
                finish = None
                self.gate.note_interruption()
            elif finish is None:
                failures += 1
                if failures > self.cfg.retries:
                    raise EngineError(f"streamed request failed after {failures} attempts: {why}")
                time.sleep(self.cfg.backoff_s * 2 ** (failures - 1))
        gen = self._parse(
            {"token_ids": ids, "logprobs": {"token_logprobs": lps}, "finish_reason": finish}, budget
        )
        gen.weight_version = versions[0] if versions else self.weight_version
        gen.token_versions = versions
        return gen

    def _stream_into(self, body: dict[str, Any], ids: list[int], lps: list[float], budget: int) -> str | None:
        """Stream one request, appending each chunk's ids and log-probs as it comes; its finish reason, INTERRUPTED
        when a sync interrupted it (the response is closed, which aborts it on the server), None when the stream
        ended without one."""
        base = self._url()
        limit = self.throughput.limit(self.cfg.timeout_s, budget)
        with self._client.stream(
            "POST", base + "/v1/completions", json={**body, "stream": True}, timeout=limit
        ) as r:
            if r.status_code >= 400:
                raise EngineError(f"{base}/v1/completions: HTTP {r.status_code} {r.read()[:500]!r}")
            for line in r.iter_lines():
                if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                    continue
                choice = first_choice(json.loads(line[5:]), f"{base}/v1/completions (streamed)")
                new = choice.get("token_ids") or []
                lp = (choice.get("logprobs") or {}).get("token_logprobs") or []
                if len(new) != len(lp):
                    raise EngineError(f"server streamed {len(new)} token ids but {len(lp)} log-probs")
                ids += new
                lps += [float(x) for x in lp]
                if choice.get("finish_reason"):
                    return str(choice["finish_reason"])
                if self.gate.interrupted():
                    return INTERRUPTED
        return None

    def _parse(self, choice: dict[str, Any], budget: int) -> Generation:
        ids = choice.get("token_ids")
        lp = (choice.get("logprobs") or {}).get("token_logprobs")
        if ids is None or lp is None:
            raise EngineError(
                "the server returned text without sampled token ids or log-probs (needs return_token_ids and "
                "logprobs, e.g. vLLM >= 0.10); re-tokenized text is not token-in/token-out, so it is refused"
            )
        if len(ids) != len(lp):
            raise EngineError(f"server returned {len(ids)} token ids but {len(lp)} log-probs")
        last = ids[-1] if ids else None
        if last is not None and last in self.cfg.stop_ids:
            reason = "stop"
        elif last is not None and last in self.cfg.eos_ids:
            reason = "eos"
        elif choice.get("finish_reason") == "length" or len(ids) >= budget:
            reason = "length"
        else:
            reason = "eos"
        return Generation(list(ids), [float(x) for x in lp], reason, self.weight_version)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        *,
        max_new_tokens: Sequence[int] | int | None = None,
        generator: Any = None,
        seeds: Sequence[int] | None = None,
    ) -> list[Generation]:
        n = len(prompts)
        budgets = per_prompt_budgets(n, params, max_new_tokens)
        seed_list: list[int | None] = list(seeds) if seeds is not None else [None] * n
        if len(seed_list) != n:
            raise ValueError("seeds must have one entry per prompt")
        futures = [
            self._pool.submit(self._one, p, params, b, s)
            for p, b, s in zip(prompts, budgets, seed_list, strict=True)
        ]
        return [f.result() for f in futures]

    def sync_weights(self, model: Any) -> None:
        raise EngineError(
            "the openai engine cannot send new weights to its server; use rollout.engine=vllm for RL"
        )

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()
