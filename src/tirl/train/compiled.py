"""`model.compile_layers`: the RL update's decoder layers through `torch.compile`, on sequence lengths padded to a
multiple (`model.compile_pad_multiple`) so that the number of shapes compiled stays bounded.

Each decoder layer is compiled once with static shapes (`dynamic=False`): a micro-batch of B rows whose longest
row has T tokens runs at (B, T rounded up to the multiple), so a run compiles at most one graph per (B, padded
length) it meets, a few per micro-batch size rather than one per length. The padding follows every row's real
tokens (attention 0, loss 0): under causal attention no real position reads it, so the log-probs of the real
positions are the unpadded pass's to float rounding (`tirl.train.logprobs`, which pads and runs the compiled
layers when given a `CompiledLayers`). The compiled modules stand in the decoder's layer list only during the
forward (`active`): the model's own modules, state dict and checkpoints are untouched, and the rollout engine,
which holds the same module, decodes through the eager layers. Rows that share a prompt do not share its pass
under compilation (the cached pass's shapes vary with every prompt). Not with FSDP (sharded parameters) and
not tried with gradient checkpointing; its speed on a GPU is not measured (docs/gpu.md).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The decoder's list of layers (`model.get_decoder().layers`, through a PEFT wrapper), or a ValueError."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    get_decoder = getattr(inner, "get_decoder", None)
    layers = getattr(get_decoder(), "layers", None) if get_decoder is not None else None
    if not isinstance(layers, torch.nn.ModuleList):
        raise ValueError(f"model.compile_layers: {type(inner).__name__} has no decoder with a list of layers")
    return layers


def running(compiled: CompiledLayers | None) -> contextlib.AbstractContextManager[None]:
    """`compiled.active()`, or nothing for None."""
    return contextlib.nullcontext() if compiled is None else compiled.active()


class CompiledLayers:
    """The compiled stand-ins of `model`'s decoder layers and the length multiple its passes pad to; `shapes`
    counts the padded (B, T) shapes run (each a compile, the first time). `options`: torch.compile's (the tests'
    backend)."""

    def __init__(self, model: torch.nn.Module, multiple: int, options: dict[str, Any] | None = None) -> None:
        if multiple < 1:
            raise ValueError(f"model.compile_pad_multiple must be >= 1, got {multiple}")
        if any(type(p).__name__ == "DTensor" for p in model.parameters()):
            raise ValueError(
                "model.compile_layers: the model is sharded (FSDP); compile it unsharded or not at all"
            )
        self.layers = decoder_layers(model)
        self.multiple = multiple
        self.compiled = [torch.compile(layer, dynamic=False, **(options or {})) for layer in self.layers]
        self.shapes: Counter[tuple[int, int]] = Counter()

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """The compiled layers in the decoder's list for the forward, the model's own ones back after it (the
        backward runs the compiled graphs it recorded)."""
        own = list(self.layers)
        try:
            for i, layer in enumerate(self.compiled):
                self.layers[i] = layer
            yield
        finally:
            for i, layer in enumerate(own):
                self.layers[i] = layer

    def pad(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, wanted: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The (B, T) tensors right-padded to a length that is a multiple of `multiple`: id 0, attention 0, not
        wanted."""
        B, T = input_ids.shape
        extra = -T % self.multiple
        self.shapes[(B, T + extra)] += 1
        if not extra:
            return input_ids, attention_mask, wanted
        pad = torch.nn.functional.pad
        return pad(input_ids, (0, extra)), pad(attention_mask, (0, extra)), pad(wanted, (0, extra))
