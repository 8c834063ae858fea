"""The policy as an OpenAI-compatible server that records tokens: `Gateway` answers `/v1/chat/completions` and
`/v1/completions` for open episodes over the run's engine, `app_of` is its FastAPI app, `serve` runs it on a thread.

An agent program reaches its episode at `http://HOST:PORT/episodes/ID/v1` (the OpenAI client's base URL), or at
`/v1` with an `X-Episode-Id` header. The endpoint samples at the run's sampling parameters whatever the request
asks (what the trainer recomputes must be what sampled), stops a turn at its tool call as tirl's loop does, and
keeps every call's prompt ids, sampled ids and log-probs in the episode (`tirl.rollout.gateway.episode`).

A chat request continues the episode's token stream when it sends back the previous request's messages, the
assistant message it was answered with (same text, same calls), then tool messages: its prompt is then the
previous prompt, the sampled ids and the tool turn rendered by `ChatRenderer.tool_response_ids`, exactly the stream
tirl's own loop builds. Any other history is rendered afresh and continues only if its ids start with the
previous stream; otherwise the episode has diverged there. Requests from concurrent episodes are sampled together,
one `Engine.generate` per batch.
"""

from __future__ import annotations

import concurrent.futures
import json
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from tirl.chat.template import ChatRenderer
from tirl.data.lengths import MAX_CHARS_PER_TOKEN, text_chars
from tirl.rollout.agent.config import AgentConfig, ProgramConfig
from tirl.rollout.engines.base import Engine
from tirl.rollout.gateway.episode import Call, Episode, continues
from tirl.rollout.gateway.messages import RequestError, messages_of, normal, reply, tools_of
from tirl.rollout.gateway.processes import score_of
from tirl.rollout.sampling import SamplingParams
from tirl.rollout.types import Generation, Origin

BATCH_WINDOW_S = 0.005  # how long the sampler waits for more requests to join a batch
# characters of a request's text, refused before any tokenizer sees it: MAX_CHARS_PER_TOKEN x 2^17 tokens, above any
# context tirl trains (tirl.data.lengths explains the bound)
MAX_REQUEST_CHARS = MAX_CHARS_PER_TOKEN << 17


class Batcher:
    """Requests from concurrent episodes sampled together on one thread (engines are not thread-safe)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.params = SamplingParams()
        self.generator: torch.Generator | None = None
        self.queue: queue.Queue[tuple[list[int], int, concurrent.futures.Future]] = queue.Queue()
        threading.Thread(target=self._work, daemon=True, name="tirl-gateway-sampler").start()

    def sample(self, prompt_ids: list[int], max_new_tokens: int) -> Generation:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self.queue.put((prompt_ids, max_new_tokens, future))
        return future.result()

    def _work(self) -> None:
        while True:
            batch = [self.queue.get()]
            deadline = time.monotonic() + BATCH_WINDOW_S
            while (left := deadline - time.monotonic()) > 0:
                try:
                    batch.append(self.queue.get(timeout=left))
                except queue.Empty:
                    break
            self._generate(batch)

    def _generate(self, batch: list[tuple[list[int], int, concurrent.futures.Future]]) -> None:
        """One engine call for `batch`; if it fails, each request alone, so that one bad request fails only
        its own episode."""
        try:
            gens = self.engine.generate(
                [p for p, _, _ in batch],
                self.params,
                max_new_tokens=[m for _, m, _ in batch],
                generator=self.generator,
            )
        except Exception as e:  # noqa: BLE001 - given to the waiting request(s)
            if len(batch) > 1:
                for one in batch:
                    self._generate([one])
            else:
                batch[0][2].set_exception(e)
            return
        for (*_, f), g in zip(batch, gens, strict=True):
            f.set_result(g)


@dataclass
class _Open:
    episode: Episode
    lock: threading.Lock = field(default_factory=threading.Lock)
    messages: list[dict[str, Any]] | None = None  # the last chat request's messages
    answered: dict[str, Any] | None = None  # the assistant message it was answered with (normal form)
    chain_start: int = 0  # prompt length of the first call of the current unbroken run


class Gateway:
    """Open episodes and the endpoint's answers to them (the HTTP layer is `app_of`)."""

    def __init__(
        self,
        engine: Engine,
        renderer: ChatRenderer,
        agent: AgentConfig,
        program: ProgramConfig,
        *,
        model_name: str = "tirl-policy",
        open_on_request: bool = False,
    ) -> None:
        self.renderer, self.agent, self.program, self.model_name = renderer, agent, program, model_name
        self.sampler = Batcher(engine)
        self.open_on_request = open_on_request  # serve-policy: an unknown episode id opens one
        self.episodes: dict[str, _Open] = {}
        self.lock = threading.Lock()

    def open(self, episode_id: str, origin: Origin | None = None) -> None:
        with self.lock:
            self.episodes[episode_id] = _Open(Episode(episode_id, origin))

    def close(self, episode_id: str) -> Episode:
        """The episode, no longer served (a late request from its program gets 404 and is never recorded)."""
        with self.lock:
            state = self.episodes.pop(episode_id)
        with state.lock:
            return state.episode

    def report(self, episode_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """The program's answer (and score), posted to /episodes/ID/report instead of printed."""
        state = self._state(episode_id)
        answer, score = body.get("answer"), body.get("score")
        if answer is not None and not isinstance(answer, str):
            raise RequestError("answer must be a string")
        if score is not None and score_of(score) is None:
            raise RequestError(f"score must be a finite number, got {str(score)[:100]}")
        with state.lock:
            state.episode.answer = answer if answer is not None else state.episode.answer
            state.episode.score = score_of(score) if score is not None else state.episode.score
        return {"ok": True}

    def _state(self, episode_id: str) -> _Open:
        with self.lock:
            if episode_id not in self.episodes and self.open_on_request:
                self.episodes[episode_id] = _Open(Episode(episode_id))
            state = self.episodes.get(episode_id)
        if state is None:
            raise RequestError(f"no open episode {episode_id!r}", 404, "episode_not_found")
        return state

    def chat(self, episode_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
        state = self._state(episode_id)
        if text_chars(body, stop_after=MAX_REQUEST_CHARS) > MAX_REQUEST_CHARS:
            raise RequestError(
                f"the request has more than {MAX_REQUEST_CHARS} characters", 400, "request_too_large"
            )
        messages, tools = messages_of(body), tools_of(body)
        with state.lock:
            e = state.episode
            prompt = self._continued(state, messages)
            if prompt is None:
                self.renderer.require_one_stream("the policy endpoint")
                pieces = self.renderer.pieces(messages, add_generation_prompt=True, tools=tools)
                prompt = self.renderer.encode_pieces(pieces)[0]
            call = self._sample(state, prompt, body)
            parsed = self.renderer.parse_calls(call.text, tools, self.agent.max_calls_per_turn)
            fmt = self.renderer.tool_format
            message = reply(
                call.text, parsed, fmt.start, self.renderer.eos_text, f"call_{episode_id}_{len(e.calls)}"
            )
            call.tool_calls = [
                (c["function"]["name"], json.loads(c["function"]["arguments"]))
                for c in message.get("tool_calls", [])
            ]
            e.calls.append(call)
            state.messages, state.answered = messages, normal(message)
        finish = "tool_calls" if call.tool_calls else ("length" if call.finish_reason == "length" else "stop")
        choice = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
        return self._response(episode_id, "chat.completion", choice, call)

    def complete(self, episode_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
        state = self._state(episode_id)
        raw = body.get("prompt")
        if text_chars(raw, stop_after=MAX_REQUEST_CHARS) > MAX_REQUEST_CHARS or (
            isinstance(raw, list) and len(raw) > MAX_REQUEST_CHARS
        ):
            raise RequestError(
                f"the prompt is longer than {MAX_REQUEST_CHARS} characters or ids", 400, "request_too_large"
            )
        if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], (str, list)):
            raw = raw[0]  # one prompt in a list
        if isinstance(raw, str):
            prompt = self.renderer.encode(raw)
        elif (
            isinstance(raw, list) and raw and all(isinstance(i, int) and not isinstance(i, bool) for i in raw)
        ):
            prompt = list(raw)
        else:
            raise RequestError("prompt must be one string or one list of token ids")
        with state.lock:
            call = self._sample(state, prompt, body)
            state.episode.calls.append(call)
            state.messages = state.answered = None
        finish = "length" if call.finish_reason == "length" else "stop"
        logprobs = (
            {
                "tokens": [self.renderer.tokenizer.decode([i]) for i in call.token_ids],
                "token_logprobs": list(call.logprobs),
            }
            if body.get("logprobs") is not None
            else None
        )
        choice = {"index": 0, "text": call.text, "finish_reason": finish, "logprobs": logprobs}
        return self._response(episode_id, "text_completion", choice, call)

    def _continued(self, state: _Open, messages: list[dict[str, Any]]) -> list[int] | None:
        """The exact stream of the previous call plus tool turns, when `messages` are the previous ones, the
        answer as returned and tool messages; else None (render afresh)."""
        calls, before = state.episode.calls, state.messages
        if not calls or before is None or state.answered is None:
            return None
        n = len(before)
        rest = messages[n + 1 :]
        if messages[:n] != before or len(messages) < n + 2 or messages[n] != state.answered:
            return None
        if not all(m["role"] == "tool" for m in rest):
            return None
        prev = calls[-1]
        prev.tool_results = [m["content"] for m in rest]
        closed = prev.finish_reason == "eos"
        newline = self.agent.token_stream == "tirl"
        return prev.stream + self.renderer.tool_response_ids(
            prev.tool_results, assistant_closed=closed, newline=newline
        )

    def _sample(self, state: _Open, prompt: list[int], body: Mapping[str, Any]) -> Call:
        e, cfg = state.episode, self.agent
        if body.get("n", 1) != 1:
            raise RequestError("n must be 1: each completion is one sample of the episode")
        if len(e.calls) >= self.program.max_calls:
            raise RequestError(
                f"the episode made agent.program.max_calls={self.program.max_calls} calls", 400, "max_calls"
            )
        vocab = len(self.renderer.tokenizer)
        if any(not 0 <= i < vocab for i in prompt):
            raise RequestError(f"prompt token ids must lie in [0, {vocab}): the policy's vocabulary")
        prev = e.calls[-1] if e.calls else None
        joined = continues(prev, prompt)
        if not joined:
            state.chain_start = len(prompt)
        left = cfg.max_response_tokens - (len(prompt) - state.chain_start)
        if left < 1:
            e.status = "budget"
            raise RequestError(
                f"the episode spent its agent.max_response_tokens={cfg.max_response_tokens}",
                400,
                "context_length_exceeded",
            )
        asked = body.get("max_completion_tokens") or body.get("max_tokens") or cfg.max_tokens_per_turn
        if isinstance(asked, bool) or not isinstance(asked, int) or asked < 1:
            raise RequestError(f"max_tokens must be a positive integer, got {asked!r}")
        room = self.sampler.engine.max_positions - len(prompt) if self.sampler.engine.max_positions else left
        if room < 1:
            raise RequestError(
                f"the prompt's {len(prompt)} tokens fill the model's {self.sampler.engine.max_positions} "
                "positions",
                400,
                "context_length_exceeded",
            )
        g = self.sampler.sample(prompt, min(asked, cfg.max_tokens_per_turn, left, room))
        if g.finish_reason == "error":
            raise RequestError("the engine failed on this request", 500, "engine_error")
        text = self.renderer.tokenizer.decode(g.token_ids, skip_special_tokens=False)
        return Call(
            prompt, list(g.token_ids), list(g.logprobs), g.finish_reason, g.weight_version, text, joined
        )

    def _response(self, episode_id: str, kind: str, choice: dict[str, Any], call: Call) -> dict[str, Any]:
        return {
            "id": f"{'chatcmpl' if kind == 'chat.completion' else 'cmpl'}-{episode_id}-{len(call.prompt_ids)}",
            "object": kind,
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(call.prompt_ids),
                "completion_tokens": len(call.token_ids),
                "total_tokens": len(call.prompt_ids) + len(call.token_ids),
            },
        }


def _stream(response: dict[str, Any]):
    """A completion as server-sent events: one chunk with the whole message, one with the finish, then [DONE]."""
    choice = response["choices"][0]
    chunk = {**response, "object": "chat.completion.chunk"}
    delta = {k: v for k, v in choice["message"].items() if v is not None}
    if "tool_calls" in delta:
        delta["tool_calls"] = [{"index": j, **c} for j, c in enumerate(delta["tool_calls"])]
    first = {**chunk, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
    last = {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]}
    for part in (first, last):
        yield f"data: {json.dumps(part)}\n\n"
    yield "data: [DONE]\n\n"


def app_of(gateway: Gateway):
    """The FastAPI app of `gateway`: OpenAI's routes under /episodes/{id}/v1 and under /v1 (X-Episode-Id)."""
    app = FastAPI(title="tirl policy endpoint")

    async def answer(fn: Callable[[str, Mapping[str, Any]], dict[str, Any]], episode: str, request: Request):
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse(RequestError("the body is not JSON").body(), status_code=400)
        try:
            if not isinstance(body, dict):
                raise RequestError("the body must be a JSON object")
            out = await run_in_threadpool(fn, episode, body)
        except RequestError as e:
            return JSONResponse(e.body(), status_code=e.status)
        if body.get("stream") and out.get("object") == "chat.completion":
            return StreamingResponse(_stream(out), media_type="text/event-stream")
        return JSONResponse(out)

    def header(request: Request) -> str:
        return request.headers.get("x-episode-id", "default")

    @app.post("/episodes/{episode}/v1/chat/completions")
    async def chat_in(episode: str, request: Request):
        return await answer(gateway.chat, episode, request)

    @app.post("/episodes/{episode}/v1/completions")
    async def complete_in(episode: str, request: Request):
        return await answer(gateway.complete, episode, request)

    @app.post("/episodes/{episode}/report")
    async def report(episode: str, request: Request):
        return await answer(gateway.report, episode, request)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await answer(gateway.chat, header(request), request)

    @app.post("/v1/completions")
    async def complete(request: Request):
        return await answer(gateway.complete, header(request), request)

    @app.get("/v1/models")
    @app.get("/episodes/{episode}/v1/models")
    async def models(episode: str = ""):
        return {"object": "list", "data": [{"id": gateway.model_name, "object": "model", "owned_by": "tirl"}]}

    return app


class Served:
    """A uvicorn server of `app` on a daemon thread; `url` its root; `stop()` ends it."""

    def __init__(self, app: Any, host: str, port: int) -> None:
        import uvicorn

        self.server = uvicorn.Server(
            uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
        )
        self.server.install_signal_handlers = lambda: None  # type: ignore[method-assign]  # not the main thread
        self.thread = threading.Thread(target=self.server.run, daemon=True, name="tirl-gateway")
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the policy endpoint did not start on {host}:{port} (is the port taken?)")
            time.sleep(0.01)
        bound = self.server.servers[0].sockets[0].getsockname()
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{bound[1]}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
