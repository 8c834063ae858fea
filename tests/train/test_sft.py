import pytest
import torch

from conftest import sample_conversation
from tirl.train.batch import collate
from tirl.train.optim import OptimConfig
from tirl.train.sft import SFTConfig, render_rows, sft_loss, train_sft


def test_sft_loss_ignores_masked_tokens(model, tokenizer, renderer):
    ((ids, mask),) = render_rows([{"messages": sample_conversation()}], renderer, max_length=512)
    batch = collate([ids], [mask], pad_id=tokenizer.pad_token_id)
    loss, n = sft_loss(model, batch)
    assert n == sum(mask[1:])
    # changing a tool-output token changes the context but the loss is never taken on it
    tool_pos = [i for i, m in enumerate(mask) if not m and i > 0]
    logits = model(input_ids=batch.input_ids).logits[0, :-1]
    ce = torch.nn.functional.cross_entropy(logits, batch.input_ids[0, 1:], reduction="none")
    manual = (ce * batch.loss_mask[0, 1:]).sum() / batch.loss_mask[0, 1:].sum()
    torch.testing.assert_close(loss, manual)
    assert tool_pos  # there are masked tokens after the prompt (the tool response)


def test_sft_learns_and_rejects_bad_rows(tokenizer, renderer):
    from conftest import make_model

    model = make_model(tokenizer).train()
    rows = [{"messages": sample_conversation()}] * 16
    cfg = SFTConfig(epochs=4, batch_size=8, optim=OptimConfig(lr=3e-3))
    batch = collate(*zip(*render_rows(rows[:1], renderer, max_length=512)), pad_id=tokenizer.pad_token_id)
    before = sft_loss(model, batch)[0].item()
    train_sft(model, renderer, rows, cfg, pad_id=tokenizer.pad_token_id, seed=0)
    after = sft_loss(model, batch)[0].item()
    assert after < before * 0.7
    with pytest.raises(ValueError, match="SFT data: row 2: expected a non-empty 'messages'"):
        render_rows([rows[0], {"prompt": []}], renderer, max_length=512)
    with pytest.raises(ValueError, match="exceed sft.max_length=10"):
        render_rows(rows[:1], renderer, max_length=10)
    with pytest.raises(ValueError, match="SFT data: row 1: no assistant tokens"):
        render_rows([{"messages": [{"role": "user", "content": "hi"}]}], renderer, max_length=512)


def test_sft_data_errors_name_the_file_and_the_row_from_1(tokenizer, tmp_path, capsys):
    import json

    from conftest import make_model
    from tirl.cli import main

    make_model(tokenizer).save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    data = tmp_path / "sft.jsonl"
    data.write_text(json.dumps({"messages": sample_conversation()}) + "\n")
    args = [
        f"model.path={tmp_path / 'm'}",
        f"sft.data={data}",
        "sft.max_length=10",
        "--out",
        str(tmp_path / "o"),
    ]
    assert main(["sft", *args]) == 2
    err = capsys.readouterr().err
    assert f"{data}: row 1: " in err and "tokens exceed sft.max_length=10" in err
