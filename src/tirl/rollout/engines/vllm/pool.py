"""vLLM for several training processes (torchrun), placement `separate`: servers beside the trainer, shared by ranks.

The servers are either one that rank 0 starts and owns (`VLLMEngine`), or several that someone else started,
reached by `rollout.urls` (data-parallel replicas, each serving the same model with `VLLM_SERVER_DEV_MODE=1`). Every
rank is a client (`VLLMPool`, an `OpenAIEngine`) of its share of them: with at least as many servers as ranks, every
world-th server from its own index; with fewer, server `rank % servers`. Each rank sends its own prompt shard.
Servers reached by URL are made to reload the run's starting weights first: one may come from another run.
Every request carries the servers' key: the one rank 0's server was started with (broadcast to the other ranks), or
for servers reached by URL the one in `$TIRL_VLLM_API_KEY` (docs/engines.md, "Who can reach the vLLM server").

Weight sync is one call on every rank, `sync_weights(policy)` (collective). Rank 0 decides the path once
(`rollout.vllm.sync`, `tirl.rollout.engines.vllm.sync`) and every rank follows it:
- memory (every managed server, and servers started with the receiver): the weights are gathered tensor by tensor
  (an FSDP2 shard is a DTensor: `full_tensor()` all-gathers it, every rank in the same order), so every rank holds
  each whole tensor in turn, and each rank writes it, as it comes, to the sockets of its share of the servers
  (`sync_share`: server i to the i-th rank in machine-major order, so the sync leaves through every trainer
  machine's link), which every vLLM worker reads into its in-place reload. Each rank listens on its own
  `rollout.vllm.sync_host`. The memory bound is one full tensor on every rank; nothing touches a disk.
- disk: the same gathers, but rank 0 keeps them in a bucket of at most `BUCKET_BYTES` plus one tensor and writes
  each full bucket as one safetensors file (no buffer ever holds the whole model), then has every server reload in
  place from that directory.
Tied embeddings are sent untied either way (see `weights`). Then every server's prefix cache is reset and every
rank learns every other's outcome (the new weight version, or the error). Every rank waits for it, so no rank samples again
before every server serves the new weights, and every `Generation` records the version it came from. A failed
sync (a dead server) raises the same `EngineError`, with the server's log, on every rank.

A LoRA policy is sent merged (W + scale * BA), merged shard by shard under FSDP and then gathered tensor by tensor.
Not here: starting several managed servers (rank 0 starts one; more are reached by URL).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as tdist

from tirl.core.io import atomic_dir, atomic_write_json
from tirl.rollout.engines.openai.engine import EngineError, OpenAIEngine, OpenAIEngineConfig
from tirl.rollout.engines.vllm.command import SERVED_NAME, VLLMEngineConfig
from tirl.rollout.engines.vllm.engine import VLLMEngine
from tirl.rollout.engines.vllm.ext.tirl_weight_receiver import KEY_ENV
from tirl.rollout.engines.vllm.sync import ServerSync, policy_tensors
from tirl.rollout.engines.vllm.weights import INDEX, ties_embeddings, untie, untied_copy
from tirl.sandbox.auth import is_loopback

BUCKET_BYTES = (
    256 * 2**20
)  # rank 0 holds at most this much (plus one tensor) of the gathered weights at a time


def rank() -> int:
    return tdist.get_rank() if tdist.is_available() and tdist.is_initialized() else 0


def world_size() -> int:
    return tdist.get_world_size() if tdist.is_available() and tdist.is_initialized() else 1


def broadcast(obj: Any) -> Any:
    """Rank 0's `obj` on every rank (a collective: every rank waits for rank 0)."""
    if world_size() == 1:
        return obj
    box = [obj if rank() == 0 else None]
    tdist.broadcast_object_list(box, src=0)
    return box[0]


def gather(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order (a collective)."""
    if world_size() == 1:
        return [obj]
    out: list[Any] = [None] * world_size()
    tdist.all_gather_object(out, obj)
    return out


def local_world() -> int:
    """The ranks on this machine (torchrun's LOCAL_WORLD_SIZE; the whole world without it)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", world_size()))


def sync_share(urls: list[str], rank_: int, world: int, local: int) -> list[str]:
    """The servers rank `rank_` streams the weights into: server i to the i-th rank in node-major order (local rank
    0 of every machine, then local rank 1, ...), so a sync leaves through every trainer machine's link rather than
    rank 0's alone. Ranks are numbered machine by machine, `local` to a machine, as torchrun numbers them."""
    nodes = world // local if local and world % local == 0 else 1
    local = world // nodes
    order = [n * local + i for i in range(local) for n in range(nodes)]
    return [u for i, u in enumerate(urls) if order[i % world] == rank_]


def spans_nodes() -> bool:
    """Whether the ranks run on more than one machine (torchrun's LOCAL_WORLD_SIZE below the world's size)."""
    return local_world() < world_size()


def url_share(urls: list[str], rank_: int, world: int) -> list[str]:
    """The servers rank `rank_` of `world` sends its requests to."""
    if not urls:
        raise ValueError("no vLLM server URLs to share")
    return urls[rank_::world] if len(urls) >= world else [urls[rank_ % len(urls)]]


def write_streamed(model: torch.nn.Module, out_dir: Path, *, untie_embeddings: bool) -> None:
    """The policy as safetensors buckets (<= BUCKET_BYTES + one tensor each) at `out_dir`, replaced atomically on
    rank 0; the other ranks only take part in the gathers. Collective."""
    from safetensors.torch import save_file

    main = rank() == 0
    with atomic_dir(out_dir) if main else contextlib.nullcontext(None) as stage:
        bucket: dict[str, torch.Tensor] = {}
        weight_map: dict[str, str] = {}
        size = 0

        def flush() -> None:
            nonlocal bucket, size
            if bucket:
                name = f"bucket-{len(set(weight_map.values())):05d}.safetensors"
                save_file(bucket, str(stage / name), metadata={"format": "pt"})
                weight_map.update(dict.fromkeys(bucket, name))
            bucket, size = {}, 0

        for name, t in policy_tensors(model, untie=False):  # untied below, in the files
            if not main:
                continue  # the gather ran; only rank 0 keeps the tensor
            bucket[name] = t
            size += t.numel() * t.element_size()
            if size >= BUCKET_BYTES:
                flush()
        if main:
            flush()
            atomic_write_json(stage / INDEX, {"metadata": {}, "weight_map": weight_map})
            (stage / "config.json").write_text(json.dumps(model.config.to_dict(), indent=2))
            if untie_embeddings:
                untie(stage)


class VLLMPool(ServerSync, OpenAIEngine):
    """This rank's client of the shared vLLM servers (module docstring); implements `tirl.rollout.engines.base.Engine`.

    `owner`: the server this process started (rank 0 without `rollout.urls`), stopped by `close()`; `key`: the
    servers' key ("" = none)."""

    capabilities = VLLMEngine.capabilities

    def __init__(
        self, urls: list[str], cfg: VLLMEngineConfig, *, model_name: str, owner: VLLMEngine | None = None,
        key: str = "",
    ) -> None:  # fmt: skip
        self.owner, self.all_urls, self.vcfg = owner, list(urls), cfg
        self.work_dir = (
            owner.work_dir if owner else Path(cfg.work_dir or tempfile.mkdtemp(prefix="tirl-vllm-"))
        )
        self.weights_dir = self.work_dir / "weights"
        self.untied = owner.untied if owner else ties_embeddings(cfg.model)
        super().__init__(
            OpenAIEngineConfig(
                urls=url_share(self.all_urls, rank(), world_size()), model=model_name, concurrency=cfg.concurrency,
                timeout_s=cfg.request_timeout_s, min_tokens_per_s=cfg.min_tokens_per_s, retries=cfg.retries,
                eos_ids=list(cfg.eos_ids), stop_ids=list(cfg.stop_ids),
            )
        )  # fmt: skip
        self.use_key(owner.api_key if owner else key)
        if owner is not None:
            self._stream = owner._stream  # the listener its server's receiver is pinned to

    def _request(
        self,
        method: str,
        path: str,
        body: dict | None = None,
        url: str | None = None,
        timeout: float | None = None,
    ) -> Any:
        """A dead owned server fails at once, with its exit code and log."""
        if self.owner is not None and (why := self.owner._dead()):
            raise EngineError(why)
        try:
            return super()._request(method, path, body, url, timeout)
        except EngineError as e:
            if self.owner is not None and (why := self.owner._dead()):
                raise EngineError(why) from e
            raise

    def sync_weights(self, model: Any) -> None:
        """Every server serves `model`'s weights once this returns, on every rank. Collective (module docstring)."""
        with self.gate.exclusive():  # this rank's requests end first (tirl.rollout.engines.gate)
            self._sync(model)

    def _sync(self, model: Any) -> None:
        if self._agreed_mode() == "memory":
            self._stream_all(model)
        else:
            write_streamed(model, self.weights_dir, untie_embeddings=self.untied)
            self._reload_all(lambda: self.weights_dir)
        self.weight_version += 1

    def _agreed_mode(self) -> str:
        """Rank 0's `sync_mode` (memory or disk) and the servers' receiver counts, the same on every rank; its
        failure raises on every rank."""
        if self._sync_mode:
            return self._sync_mode
        outcome: tuple[str, str, dict[str, int]] = ("ok", "", {})
        if rank() == 0:
            try:
                outcome = ("ok", self.sync_mode(self.all_urls), self._counts)
            except Exception as e:
                outcome = ("error", str(e), {})
        kind, value, counts = broadcast(outcome)
        if kind == "error":
            raise EngineError(value)
        self.adopt_mode(value, counts)
        return value

    def _stream_all(self, model: Any) -> None:
        """`rollout.vllm.sync=memory`: every rank runs the gathers, so every rank holds each whole tensor in turn,
        and each streams it into its share of the servers (`sync_share`); then every rank learns how all went."""
        tensors = policy_tensors(model, untie=self.untied, dtype=self.vcfg.dtype)
        mine = sync_share(self.all_urls, rank(), world_size(), local_world())
        outcome = ""
        if mine:
            try:
                self.stream_into(mine, tensors)
            except Exception as e:
                why = self.owner._dead() if self.owner is not None else None
                outcome = why or f"rank {rank()}: weight sync into {', '.join(mine)} failed: {e}"
        for _ in tensors:  # the rest of the gathers, whatever happened here
            pass
        if failed := [why for why in gather(outcome) if why]:
            raise EngineError(failed[0])

    def serve_initial(self) -> None:
        """Servers reached by URL serve `model` as the run starts (one may come from another run). Collective."""
        if self.untied:
            self._reload_all(lambda: untied_copy(self.vcfg.model, self.work_dir / "initial"))
        else:
            self._reload_all(lambda: Path(self.vcfg.model))

    def _reload_all(self, path: Callable[[], Path]) -> None:
        """Rank 0 has every server reload from `path()` and tells every rank how it went; a failure raises the same
        EngineError on every rank (otherwise the others would wait for ever)."""
        outcome: tuple[str, str] = ("ok", "")
        if rank() == 0:
            url = ""
            try:
                where = path()
                for url in self.all_urls:
                    self._reload(url, where)
            except Exception as e:
                outcome = ("error", f"weight sync into {url or 'the vLLM servers'} failed: {e}")
        kind, why = broadcast(outcome)
        if kind == "error":
            raise EngineError(why)

    def _reload(self, url: str, path: Path) -> None:
        body = {"method": "reload_weights", "kwargs": {"weights_path": str(path)}}
        self._request("POST", "/collective_rpc", body, url)
        self.reset_prefix_cache(url)

    def close(self) -> None:
        super().close()
        self.close_stream()
        if self.owner is not None:
            self.owner.close()


def build_pool(cfg: VLLMEngineConfig, urls: list[str], model_name: str = "") -> VLLMPool:
    """Every rank's `VLLMPool`: over `urls` when given, else over the server rank 0 starts now (its URL, or why it
    did not start, is broadcast so that no rank waits for a server that will never come). Collective."""
    if urls:
        key = os.environ.get(KEY_ENV, "")
        if not key and rank() == 0:
            warnings.warn(
                f"rollout.urls: no ${KEY_ENV} in the environment, so the servers are reached without a key; "
                "whoever reaches them can replace their weights (docs/engines.md: Who can reach the vLLM server)",
                stacklevel=2,
            )
        pool = VLLMPool(urls, cfg, model_name=model_name or SERVED_NAME, key=key)
        try:
            pool.serve_initial()
        except BaseException:
            pool.close()
            raise
        return pool
    if spans_nodes() and is_loopback(cfg.host):  # every rank sees the same: all refuse, none waits
        raise EngineError(
            f"the ranks span several machines, and the vLLM server rank 0 starts would bind {cfg.host}, which the "
            "other machines cannot reach: set rollout.vllm.host to rank 0's address, or start servers with "
            "`tirl serve-vllm` and pass rollout.urls (docs/distributed.md: Across machines)"
        )
    owner, started = None, None
    if rank() == 0:
        try:
            owner = VLLMEngine(cfg)
            started = ("ok", owner.url, owner.api_key)
        except Exception as e:
            started = ("error", str(e), "")
            broadcast(started)
            raise
    kind, value, key = broadcast(started)
    if kind == "error":
        raise EngineError(f"rank 0 could not start the vLLM server: {value}")
    return VLLMPool([value], cfg, model_name=SERVED_NAME, owner=owner, key=key)
