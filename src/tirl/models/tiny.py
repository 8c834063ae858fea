"""Tiny models for the demo and the tests: a BPE tokenizer trained on the task's text and a small Qwen2 model.

Both are ordinary Hugging Face artefacts (`save_pretrained` / `from_pretrained`), so everything downstream loads
them through `model.path` exactly like a real checkpoint. Digits are always single tokens: a tiny model can learn to
copy numbers digit by digit, which is all the demo asks of it (the tool does the arithmetic).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from tirl.chat.template import CHATML_JINJA
from tirl.models.config import TinyModelConfig

PAD, EOS, IM_START = "<|endoftext|>", "<|im_end|>", "<|im_start|>"
SPECIAL_TOKENS = [PAD, IM_START, EOS, "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]


def train_tokenizer(texts: Iterable[str], *, vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained on `texts`, digits split one per token, with ChatML special tokens and template."""
    tok = Tokenizer(models.BPE())
    # One token per digit, a preceding space glued to the first digit (" 954" -> " 9" "5" "4"); otherwise split
    # only before whitespace, so scaffolding such as `{"name":` can become single tokens and sequences stay short.
    # A bare space token before every number makes copying numbers far slower to learn for a tiny model.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r" ?[0-9]"), behavior="isolated"),
            pre_tokenizers.Split(Regex(r"\s+"), behavior="merged_with_next"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Special tokens are atoms: train on the text between them, so no merge can spell one out of characters.
    split = re.compile("|".join(re.escape(t) for t in SPECIAL_TOKENS))
    tok.train_from_iterator(
        (piece for text in texts for piece in split.split(text) if piece), trainer=trainer
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS,
        pad_token=PAD,
        bos_token=None,
        unk_token=None,
        additional_special_tokens=SPECIAL_TOKENS[1:2] + SPECIAL_TOKENS[3:],
    )
    fast.chat_template = CHATML_JINJA
    return fast


def build_model(
    tokenizer: PreTrainedTokenizerFast, config: TinyModelConfig, *, seed: int = 0
) -> Qwen2ForCausalLM:
    """A freshly initialised Qwen2 causal LM sized by `config` (vocabulary from the tokenizer)."""
    torch.manual_seed(seed)
    hf_config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        max_position_embeddings=config.max_positions,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids(EOS),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD),
    )
    model = Qwen2ForCausalLM(hf_config)
    model.generation_config.pad_token_id = hf_config.pad_token_id
    return model


def build_tiny(out_dir: str | Path, texts: Iterable[str], config: TinyModelConfig, *, seed: int = 0) -> Path:
    """Train the tokenizer, build the model and save both as one Hugging Face model directory."""
    out = Path(out_dir)
    tokenizer = train_tokenizer(texts, vocab_size=config.vocab_size)
    model = build_model(tokenizer, config, seed=seed)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out)
    model.save_pretrained(out)
    return out


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
