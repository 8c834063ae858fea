"""`rollout.torch.*`: the in-process engine's own settings (`SECTION`: a section of
`tirl.rollout.config.RolloutConfig`, found by `tirl.rollout.engines.registry`)."""

from __future__ import annotations

from dataclasses import dataclass

from tirl.core.bounds import MAX_IN_FLIGHT, check_counts
from tirl.rollout.engines.torch.packed import PACK_MODES

GRAPH_MODES = ("auto", "on", "off")  # rollout.torch.cuda_graphs (tirl.rollout.engines.torch.graph_decode)


@dataclass
class TorchEngineConfig:
    """`rollout.torch.*`: the in-process engine (`tirl.rollout.engines.torch.engine.TorchEngine`)."""

    max_batch_size: int = 256  # sequences per engine forward
    # the keys and values of a call's finished rows kept (up to this many MiB) so that the next turn, which extends
    # them, pre-fills only its new tokens (tirl.rollout.engines.torch.kv_cache.KeptPrefixes); 0 = pre-fill every turn whole
    keep_prefix_mib: int = 1024
    # decode steps through torch.compile (dynamic shapes), compiled once per engine: pays on small models, whose
    # steps are mostly per-operation overhead (the demo's: 1.24-1.29x the eager engine), not on SmolLM2-135M on a
    # CPU (0.55-0.92x): off by default (docs/benchmarks.md#sampling-engines)
    compile: bool = False
    # on a CPU: the Linears' no-grad forwards on weights packed once per weight version for oneDNN
    # (tirl.rollout.engines.torch.packed). auto = bf16 decode always, fp32 on an AMD CPU (PyTorch's MKL path stops at AVX2
    # there: SmolLM2's fp32 decode 1.6-1.8x as fast packed) from 512 wide, never with rollout.torch.compile;
    # on = at any width on any CPU; off = PyTorch's own matmuls
    pack: str = "auto"
    # decode steps of static shapes captured as CUDA graphs, one per batch-size bucket, and replayed
    # (tirl.rollout.engines.torch.graph_decode). auto = on where the model is on a CUDA device and neither compiled nor sharded;
    # on = that or an error; off = the eager decode. Off by default: its speed on a GPU is not yet measured
    cuda_graphs: str = "off"
    # the static step of rollout.torch.cuda_graphs through torch.compile (static shapes, compiled once per bucket
    # and captured into its graph); needs cuda_graphs on or auto. Off by default: its speed on a GPU is not measured
    compile_graph_step: bool = False
    # the CUDA-graph decode's KV arena (tirl.rollout.engines.torch.graph_arena), allocated once and kept: GiB; 0 = a quarter of
    # the GPU's memory. A chunk whose rows x positions do not fit is refused with the numbers
    graph_kv_gib: float = 0.0

    def __post_init__(self) -> None:
        if self.pack not in PACK_MODES:
            raise ValueError(f"rollout.torch.pack must be one of {', '.join(PACK_MODES)}, got {self.pack!r}")
        if self.cuda_graphs not in GRAPH_MODES:
            raise ValueError(
                f"rollout.torch.cuda_graphs must be one of {', '.join(GRAPH_MODES)}, got {self.cuda_graphs!r}"
            )
        if self.compile_graph_step and self.cuda_graphs == "off":
            raise ValueError(
                "rollout.torch.compile_graph_step=true compiles the static step of rollout.torch.cuda_graphs, "
                "which is off: set rollout.torch.cuda_graphs=auto or on"
            )
        if not self.graph_kv_gib >= 0:  # NaN fails too
            raise ValueError(f"rollout.torch.graph_kv_gib must be >= 0 (0 = auto), got {self.graph_kv_gib}")
        if self.keep_prefix_mib < 0:
            raise ValueError(
                f"rollout.torch.keep_prefix_mib must be >= 0 (0 = off), got {self.keep_prefix_mib}"
            )
        bounds = {"max_batch_size": (1, MAX_IN_FLIGHT), "keep_prefix_mib": (0, 1 << 20)}  # MiB: 1 TiB
        check_counts(self, "rollout.torch", bounds)


SECTION = TorchEngineConfig  # rollout.torch.* (tirl.rollout.engines.registry)
