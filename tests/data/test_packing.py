"""Packed fine-tuning samples through the production forward step (trainer/engines/megatron.py `_forward_step`):
no attention or position leaks across conversations, the masked per-token loss is exact, masked tokens contribute
nothing, and fine-tuning on packed chat samples lowers the assistant tokens' loss."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from tests.model import attention_worker
from tests.model.conftest import model_parallel  # noqa: F401  (the one-process megatron world these tests use)
from trainer.data import DataError
from trainer.data.packing import first_fit, packed_sample
from trainer.engines import megatron as megatron_engine
from trainer.model import llama, loss
from trainer.model.weights import model_only_config

VOCAB = attention_worker.MODEL.vocab_size
PAD = 0


def conversations(lengths: list[int], seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Random token ids with a loss mask on each conversation's second half (its 'answer')."""
    rng = np.random.default_rng(seed)
    return [
        (rng.integers(1, VOCAB, length), (np.arange(length) >= length // 2).astype(np.int64))
        for length in lengths
    ]


def tiny_model(seq_length: int):
    cfg = model_only_config(attention_worker.MODEL, seq_length=seq_length)
    return llama.build(cfg).chunks[0]


def forward(chunk, sample: dict, **extra) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The production forward step on one packed sample: per-token loss, and the masked sum and token count."""
    batch = {field: tensor[None] for field, tensor in sample.items()} | extra
    per_token_loss, loss_sum = megatron_engine._forward_step(iter([batch]), chunk)
    total, tokens, _ = loss_sum(per_token_loss)
    return per_token_loss, total, tokens


def test_first_fit_keeps_whole_conversations_within_the_capacity():
    packs = first_fit(np.array([6, 5, 4, 3, 2]), 8)
    assert packs == [[0, 4], [1, 3], [2]]  # 6+2, 5+3, 4


def test_a_packed_sample_shifts_labels_within_each_conversation_and_restarts_positions():
    pieces = [(np.array([5, 6, 7]), np.array([0, 0, 1])), (np.array([8, 9]), np.array([0, 1]))]
    sample = packed_sample(pieces, seq_length=6, pad_id=PAD, segments=3)
    assert sample["tokens"].tolist() == [5, 6, 8, PAD, PAD, PAD]
    assert sample["labels"].tolist() == [6, 7, 9, PAD, PAD, PAD]
    assert sample["loss_mask"].tolist() == [0, 1, 1, 0, 0, 0]
    assert sample["position_ids"].tolist() == [0, 1, 0, 0, 1, 2]
    assert sample["cu_seqlens"].tolist() == [0, 2, 3, 6]


@pytest.mark.parametrize("lengths", [[11, 7, 14], [30]])
def test_logits_on_a_packed_sequence_equal_each_conversation_alone(model_parallel, lengths):  # noqa: F811
    seq_length = 40
    chunk = tiny_model(seq_length).eval()
    pieces = conversations(lengths, seed=len(lengths))
    sample = packed_sample(pieces, seq_length, PAD, segments=len(lengths) + 1)
    with torch.no_grad():
        packed, _, _ = forward(chunk, sample)
        start = 0
        for ids, mask in pieces:
            alone = packed_sample([(ids, mask)], ids.size - 1, PAD, segments=1)
            single, _, _ = forward(chunk, alone)
            end = start + ids.size - 1
            torch.testing.assert_close(packed[0, start:end], single[0], rtol=0, atol=1e-5)
            start = end
        if len(lengths) > 1:  # the same tokens under one causal mask: the later conversations see the earlier
            leaked = chunk(
                sample["tokens"][None], sample["position_ids"][None], None, labels=sample["labels"][None]
            )
            second = slice(lengths[0] - 1, lengths[0] + lengths[1] - 2)
            assert (leaked[0, second] - packed[0, second]).abs().max() > 1e-3


def test_the_masked_loss_is_the_per_token_mean_over_the_global_batch(model_parallel):  # noqa: F811
    """Two micro-batches whose masks keep 2 and 1 tokens: the global batch's loss is (2 + 4 + 5) / 3 = 11/3, not
    the mean of the micro-batch means ((2 + 4) / 2 + 5) / 2 = 4."""
    micro_batches = [
        (torch.tensor([[2.0, 1.0, 4.0]]), torch.tensor([[1.0, 0.0, 1.0]])),
        (torch.tensor([[3.0, 5.0, 7.0]]), torch.tensor([[0.0, 1.0, 0.0]])),
    ]
    totals = torch.zeros(2)
    for per_token_loss, mask in micro_batches:
        total, tokens, reported = megatron_engine._loss_sum(mask, per_token_loss)
        assert (total.item(), tokens.item()) == (sum(per_token_loss[mask > 0].tolist()), int(mask.sum()))
        totals += reported["lm loss"]
    assert loss.global_mean(totals) == pytest.approx(11 / 3, abs=1e-12)


def test_masked_tokens_contribute_nothing_to_the_loss_or_its_gradient(model_parallel):  # noqa: F811
    chunk = tiny_model(32)
    sample = packed_sample(conversations([12, 9, 8], seed=5), 32, PAD, segments=4)
    changed = dict(
        sample, labels=torch.where(sample["loss_mask"] > 0, sample["labels"], (sample["labels"] + 7) % VOCAB)
    )
    assert not torch.equal(changed["labels"], sample["labels"])

    def loss_and_gradients(batch):
        chunk.zero_grad()
        _, total, tokens = forward(chunk, batch)
        (total / tokens).backward()
        return total / tokens, [p.grad.clone() for p in chunk.parameters()]

    (original, grads), (other, other_grads) = loss_and_gradients(sample), loss_and_gradients(changed)
    assert original.item() == other.item()
    assert all(torch.equal(a, b) for a, b in zip(grads, other_grads, strict=True))


def test_fine_tuning_on_packed_samples_lowers_the_assistant_tokens_loss(model_parallel):  # noqa: F811
    """The answers are a fixed function of the prompts (each answer token is its prompt token + 1), so a model
    that learns from the masked loss predicts them better; 40 AdamW steps on four packed samples."""
    torch.manual_seed(0)
    chunk = tiny_model(48)
    rng = np.random.default_rng(11)
    samples = []
    for _ in range(4):
        pieces = []
        for _ in range(4):
            prompt = rng.integers(1, VOCAB - 1, 5)
            ids = np.concatenate([prompt, prompt + 1])
            pieces.append((ids, (np.arange(ids.size) >= prompt.size).astype(np.int64)))
        samples.append(packed_sample(pieces, 48, PAD, segments=5))
    optimizer = torch.optim.AdamW(chunk.parameters(), lr=3e-3)

    def mean_loss() -> float:
        with torch.no_grad():
            totals = [forward(chunk, sample)[1:] for sample in samples]
        return sum(t.item() for t, _ in totals) / sum(n.item() for _, n in totals)

    before = mean_loss()
    for step in range(40):
        optimizer.zero_grad()
        _, total, tokens = forward(chunk, samples[step % len(samples)])
        (total / tokens).backward()
        optimizer.step()
    after = mean_loss()
    assert after < 0.7 * before, f"assistant loss {before:.3f} -> {after:.3f}"


def test_the_loader_packs_a_prepared_chat_dataset_into_whole_conversations(tmp_path, model_parallel):  # noqa: F811
    from tests.data.conftest import write_jsonl
    from tests.data.test_chat import CHAT, bpe
    from trainer.data.chat import prepare_chat
    from trainer.data.packing import build_packed_datasets
    from trainer.data.sampler import sample_batches

    tokenizer_path = tmp_path / "tokenizer.json"
    tokenizer = bpe(tokenizer_path, ["<|endoftext|>"])
    records = [{"messages": CHAT[1 : 3 + 2 * (i % 2)]} for i in range(20)]
    data = write_jsonl(tmp_path / "chat.jsonl", records)
    manifest = prepare_chat([data], str(tmp_path / "c"), tokenizer=str(tokenizer_path)).manifest
    seq_length = 2 * manifest.longest

    train, valid = build_packed_datasets(str(tmp_path / "c"), "90,10,0", seq_length, 1234, (6, 2), 0)

    assert (len(train), len(valid)) == (6, 2)
    batch = next(sample_batches(train, 0, 2, 1, 0, 1))
    bounds = batch["cu_seqlens"][0][batch["cu_seqlens"][0] >= 0].tolist()
    assert batch["tokens"].shape == (1, seq_length) and bounds[0] == 0 and bounds[-1] == seq_length
    eod = tokenizer.token_to_id("<|endoftext|>")
    for start, end in itertools.pairwise(bounds[:-1]):  # each conversation (the last segment is padding)
        text = tokenizer.decode(batch["tokens"][0, start:end].tolist(), skip_special_tokens=False)
        assert text.startswith("<|user|>\n") and batch["position_ids"][0, start] == 0
        # its last labels: the end of its last answer, then the template's newline
        assert (
            batch["labels"][0, end - 2] == eod
            and tokenizer.decode([int(batch["labels"][0, end - 1])]) == "\n"
        )
    with pytest.raises(DataError, match="leaves the valid split"):
        build_packed_datasets(str(tmp_path / "c"), "100,0,0", seq_length, 1234, (6, 2), 0)


@pytest.fixture(scope="module")
def tiny_chat(tiny_corpus, tmp_path_factory) -> str:
    """60 conversations that teach a rule (the answer repeats the question's words in reverse), prepared with the
    tiny corpus's tokenizer; returns the chat dataset's prefix."""
    from tests.data.conftest import write_jsonl
    from trainer.data.chat import prepare_chat

    rng = np.random.default_rng(3)
    words = ["tokens", "model", "layer", "gradient", "shard", "node", "device", "loss", "step", "batch"]
    records = []
    for _ in range(60):
        question = [str(word) for word in rng.choice(words, 4)]
        records.append({"prompt": " ".join(question), "completion": " ".join(reversed(question))})
    base = tmp_path_factory.mktemp("chat")
    data = write_jsonl(base / "chat.jsonl", records)
    prefix = str(base / "chat")
    prepare_chat([data], prefix, tokenizer=f"{tiny_corpus}.tokenizer.json", seq_length=64)
    return prefix


@pytest.mark.slow
def test_packed_chat_training_at_tp2_pp2_matches_one_process_and_its_loss_falls(launcher, tiny_chat):
    """`train` with data.format chat (the production loop, torchrun): the same per-token losses at TP=2 x PP=2 as
    in one process, and the held-out assistant tokens' loss falling by a fifth over 20 steps."""
    from tests.distributed.test_parity import RELATIVE

    chat = (
        "data.format=chat",
        f"data.prefixes=[{tiny_chat}]",
        "data.seq_length=64",
        "schedule.micro_batch_size=1",
        "schedule.global_batch_size=4",
        "checkpoint.save_interval=1000",
        "optimizer.lr=1e-2",  # 20 steps from a random model: the rule must show in the held-out answers
        "optimizer.min_lr=1e-3",
    )
    reference = launcher.launch("chat_single", 1, *chat)
    single = reference.losses()
    layout = launcher.launch(
        "chat_tp2_pp2",
        4,
        *chat,
        "parallel.tensor_model_parallel_size=2",
        "parallel.pipeline_model_parallel_size=2",
    ).losses()
    for step in (1, 2, 3):
        assert abs(layout[step] - single[step]) <= RELATIVE * abs(single[step]), (step, layout, single)
    evaluations = [record["val_loss"] for record in reference.records if "val_loss" in record]
    assert len(evaluations) == 2 and evaluations[-1] < 0.8 * evaluations[0], f"validation loss: {evaluations}"
