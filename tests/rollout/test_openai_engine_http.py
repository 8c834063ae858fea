"""The OpenAI engine over a real socket: a small /v1/completions server on 127.0.0.1 backed by the tiny model's
torch engine. The OpenAI engine must return exactly the ids, log-probs and stop reasons the torch engine gives
directly (same model, greedy), with stop_token_ids honoured."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

from conftest import make_model
from tirl.rollout.engines.openai.engine import OpenAIEngine, OpenAIEngineConfig
from tirl.rollout.engines.torch.engine import TorchEngine
from tirl.rollout.sampling import SamplingParams


def _serve(engine: TorchEngine) -> ThreadingHTTPServer:
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, obj):
            data = json.dumps(obj).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._send({"data": [{"id": "tiny"}]})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            engine.stop_ids = set(body["stop_token_ids"])
            with lock, torch.no_grad():
                g = engine.generate(
                    [body["prompt"]],
                    SamplingParams(temperature=body["temperature"]),
                    max_new_tokens=body["max_tokens"],
                )[0]
            finish = "length" if g.finish_reason == "length" else "stop"
            self._send({"choices": [{"token_ids": g.token_ids, "logprobs": {"token_logprobs": g.logprobs},
                                     "finish_reason": finish}]})  # fmt: skip

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_openai_engine_matches_torch_engine_over_http(tokenizer, renderer):
    torch.manual_seed(0)
    model = make_model(tokenizer)
    eos = [renderer.eos_id]
    stop = tokenizer.convert_tokens_to_ids("</tool_call>")
    direct = TorchEngine(model, eos_ids=eos, pad_id=renderer.pad_id, stop_ids=[stop])
    server = _serve(TorchEngine(model, eos_ids=eos, pad_id=renderer.pad_id))
    url = f"http://127.0.0.1:{server.server_address[1]}"
    remote = OpenAIEngine(
        OpenAIEngineConfig(urls=[url, url], model="tiny", concurrency=4, eos_ids=eos, stop_ids=[stop])
    )
    try:
        remote.check()
        prompts = [tokenizer.encode(t) for t in ["What is 2+3?", "Compute 7*6 with code.", "hi", "12-5"]]
        want = direct.generate(prompts, SamplingParams(temperature=0.0), max_new_tokens=12)
        got = remote.generate(prompts, SamplingParams(temperature=0.0), max_new_tokens=12)
        assert [g.token_ids for g in got] == [g.token_ids for g in want]
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(w.logprobs))
            assert g.finish_reason == w.finish_reason
    finally:
        remote.close()
        server.shutdown()


def test_cli_eval_with_the_openai_engine_matches_the_torch_engine(tokenizer, renderer, tmp_path):
    """`tirl eval rollout.engine=openai` end to end (greedy): the same trajectories as `rollout.engine=torch`."""
    from tirl.cli import main

    torch.manual_seed(0)
    model = make_model(tokenizer)
    model.save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "".join(
            json.dumps({"data_source": "tirl/arith", "prompt": [{"role": "user", "content": f"What is {k} + 1?"}],
                        "reward_model": {"ground_truth": str(k + 1)}, "extra_info": {"id": f"p{k}"}}) + "\n"
            for k in range(3)
        )
    )  # fmt: skip
    server = _serve(TorchEngine(model, eos_ids=[renderer.eos_id], pad_id=renderer.pad_id))
    url = f"http://127.0.0.1:{server.server_address[1]}"
    base = [
        f"eval.data={rows}",
        f"model.path={tmp_path / 'm'}",
        "eval.n=1",
        "eval.temperature=0",
        "agent.max_response_tokens=16",
    ]
    try:
        assert main(["eval", *base, f"out_dir={tmp_path / 'torch'}"]) == 0
        remote = ["rollout.engine=openai", f"rollout.urls=[{url}]", "rollout.model_name=tiny"]
        assert main(["eval", *base, *remote, f"out_dir={tmp_path / 'openai'}"]) == 0
    finally:
        server.shutdown()

    def ids(d):
        path = next((tmp_path / d).rglob("trajectories.jsonl"))
        return sorted(
            (t["meta"].get("id", ""), t["response_ids"])
            for t in map(json.loads, path.read_text().splitlines())
        )

    assert ids("openai") == ids("torch") and len(ids("torch")) == 3
