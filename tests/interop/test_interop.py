"""Hugging Face interop: a random transformers Llama converts to a trainer checkpoint and back exactly; our logits
at TP=2 x PP=2 and `score` equal transformers'; `train` fine-tunes from it; bad input is refused up front."""

import itertools
import json
import sys
from argparse import Namespace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM

from tests.support.training import sealed_checkpoint, torchrun
from trainer.__main__ import main as trainer_main
from trainer.config import ConfigError, load_config

VOCAB = 520  # above the tiny corpus's 512 (fine-tuning reads it), and padded to 640: padding is exercised
TOKENS = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(3)).tolist()
SEQUENCES = [
    torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (17, 9, 33, 5)
]


# Llama 3.1's scaling; at head dim 8 this base puts a wavelength in each regime: kept, smoothed, scaled.
LLAMA3_ROPE = dict(
    rope_type="llama3",
    rope_theta=2e5,
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=8192,
)


def trainer(*args: str) -> list[str]:
    return [sys.executable, "-m", "trainer", *args]


def as_args(overrides: list[str]) -> list[str]:
    return [arg for override in overrides for arg in ("--set", override)]


@pytest.fixture(scope="session")
def hf_llamas(tmp_path_factory) -> dict[str, Path]:
    """Two random Llamas with grouped-query attention and a non-default rope base: untied in fp32, saved in
    shards with an index; tied in bf16, one file, with Llama 3.1's rope scaling. Norm weights are random too
    (ones would hide a swap)."""
    base = tmp_path_factory.mktemp("hf")
    shape = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        initializer_range=0.1,
    )
    variants = {
        "untied": (
            dict(rope_theta=5e4, max_position_embeddings=64, tie_word_embeddings=False),
            torch.float32,
            "30KB",
        ),
        "tied": (
            dict(rope_parameters=LLAMA3_ROPE, max_position_embeddings=131072, tie_word_embeddings=True),
            torch.bfloat16,
            "5GB",
        ),
    }
    for name, (features, dtype, shard_size) in variants.items():
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(**shape, **features))
        with torch.no_grad():
            for parameter_name, parameter in model.named_parameters():
                if parameter_name.endswith("norm.weight"):
                    parameter.normal_(1.0, 0.2)
        model.to(dtype).save_pretrained(base / name, max_shard_size=shard_size)
    assert (base / "untied" / "model.safetensors.index.json").is_file()
    return {name: base / name for name in variants}


def transformers_model(directory: Path) -> LlamaForCausalLM:
    return LlamaForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()


def safetensors_of(directory: Path) -> dict[str, torch.Tensor]:
    tensors = {}
    for file in sorted(directory.glob("*.safetensors")):
        tensors |= load_file(file)
    return tensors


@pytest.fixture(scope="session")
def converted(hf_llamas, launcher) -> dict[str, Path]:
    """The untied model converted at TP=2 (2 processes), the tied one in one process; both load at TP2 x PP2."""
    paths = {}
    for name, layout in (("untied", ["--tp", "2"]), ("tied", [])):
        paths[name] = launcher.base / f"converted-{name}"
        launcher.run(
            f"convert-{name}",
            trainer("convert", "--from-hf", str(hf_llamas[name]), "--out", str(paths[name]), *layout),
        )
    return paths


@pytest.fixture(scope="session")
def exported(converted, launcher) -> dict[str, Path]:
    paths = {}
    for name, checkpoint in converted.items():
        paths[name] = launcher.base / f"exported-{name}"
        launcher.run(
            f"export-{name}", trainer("convert", "--to-hf", str(checkpoint), "--out", str(paths[name]))
        )
    return paths


@pytest.mark.slow
def test_converted_checkpoint_is_published_with_latest_a_train_config_and_no_staging_left(converted):
    untied = converted["untied"]
    assert sorted(p.name for p in untied.iterdir()) == ["iter_0000000", "latest", "train.yaml"]
    assert (untied / "latest").read_text() == "iter_0000000\n"
    assert not untied.with_name(untied.name + ".tmp").exists()
    cfg = load_config(untied / "train.yaml")
    assert (cfg.model.num_layers, cfg.model.num_query_groups, cfg.model.rotary_base) == (4, 2, 50000)
    assert (cfg.model.vocab_size, cfg.model.norm_epsilon, cfg.model.share_embeddings_and_output_weights) == (
        VOCAB,
        1e-6,
        False,
    )
    assert cfg.checkpoint.load == str(untied) and cfg.checkpoint.finetune


@pytest.mark.slow
@pytest.mark.parametrize("name", ["untied", "tied"])
def test_tp2_pp2_logits_match_transformers(name, hf_llamas, converted, launcher):
    out = launcher.base / "logits"
    if not out.exists():  # one launch loads both models
        out.mkdir()
        (out / "tokens.json").write_text(json.dumps(TOKENS))
        command = torchrun(4, "tests.support.logits_worker", "2", "2", str(out / "tokens.json"), str(out))
        launcher.run("logits", command + [f"{n}={path}" for n, path in converted.items()])
    with torch.no_grad():
        want = transformers_model(hf_llamas[name])(torch.tensor(TOKENS)).logits
    got = torch.load(out / f"{name}.pt")
    assert got.shape == want.shape == (2, 12, VOCAB)
    assert (got - want).abs().max().item() < 1e-4
    assert want.abs().max().item() > 0.1  # the comparison is not between near-zero numbers


@pytest.mark.slow
@pytest.mark.parametrize("name", ["untied", "tied"])
def test_round_trip_reproduces_every_tensor_bitwise(name, hf_llamas, exported):
    original, back = safetensors_of(hf_llamas[name]), safetensors_of(exported[name])
    assert sorted(back) == sorted(original)
    for key, tensor in original.items():
        assert back[key].dtype == tensor.dtype and torch.equal(back[key], tensor), key
    config = json.loads((hf_llamas[name] / "config.json").read_text())
    assert json.loads((exported[name] / "config.json").read_text()) == config


@pytest.mark.slow
def test_score_tokens_equals_the_transformers_loss(hf_llamas, converted, launcher, tmp_path):
    tokens = tmp_path / "sequences.json"
    tokens.write_text(json.dumps(SEQUENCES))
    output = launcher.run(
        "score-tokens",
        trainer(
            "score", "--checkpoint", str(converted["untied"]), "--tokens", str(tokens), "--tp", "2", "--json"
        ),
    )
    result = json.loads(next(line for line in output.splitlines() if line.startswith("{")))
    model, total = transformers_model(hf_llamas["untied"]), 0.0
    with torch.no_grad():
        for sequence in SEQUENCES:
            ids = torch.tensor([sequence])
            total += F.cross_entropy(model(ids).logits[0, :-1], ids[0, 1:], reduction="sum").item()
    predicted = sum(len(s) - 1 for s in SEQUENCES)
    assert (result["tokens"], result["sequences"]) == (predicted, len(SEQUENCES))
    assert result["loss"] == pytest.approx(total / predicted, rel=1e-6)
    assert result["perplexity"] == pytest.approx(torch.tensor(total / predicted).exp().item(), rel=1e-6)


# Fine-tuning the untied model on the tiny corpus at TP=1 x PP=2 (it was converted at TP=2 x PP=1), in fp32.
def finetune_settings(corpus: str, run_dir: Path, train_iters: int, *more: str) -> list[str]:
    return [
        f"data.prefixes=[{corpus}]",
        f"data.tokenizer_path={corpus}.tokenizer.json",
        "data.seq_length=32",
        "data.split=80,20,0",
        "precision=fp32",
        "parallel.tensor_model_parallel_size=1",
        f"schedule.train_iters={train_iters}",
        "schedule.micro_batch_size=2",
        "schedule.global_batch_size=4",
        "schedule.lr_warmup_iters=1",
        "schedule.eval_iters=2",
        "optimizer.lr=1e-3",
        "logging.tensorboard=false",
        f"logging.run_dir={run_dir}",
        *more,
    ]


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="session")
def finetuned(converted, launcher, tiny_corpus) -> Path:
    """4 steps from the converted weights with the recipe `convert` wrote, at another layout than converted."""
    run_dir = launcher.base / "finetune" / "run"
    recipe = str(converted["untied"] / "train.yaml")
    settings = finetune_settings(tiny_corpus, run_dir, 4, "parallel.pipeline_model_parallel_size=2")
    launcher.run("finetune", trainer("train", "--config", recipe, *as_args(settings)))
    return run_dir


@pytest.mark.slow
def test_finetune_starts_from_the_converted_weights(finetuned, converted, hf_llamas, tiny_corpus):
    from trainer.checkpoint import formats as checkpoint
    from trainer.data.datasets import build_gpt_datasets
    from trainer.data.sampler import sample_batches

    cfg = load_config(converted["untied"] / "train.yaml", finetune_settings(tiny_corpus, finetuned, 4))
    s = cfg.schedule
    _, valid, _ = build_gpt_datasets(
        prefixes=cfg.data.prefixes,
        weights=None,
        split=cfg.data.split,
        seq_length=cfg.data.seq_length,
        seed=cfg.seed,
        num_samples=(s.train_iters * s.global_batch_size, s.eval_iters * s.global_batch_size, 0),
        tokenizer_path=cfg.data.tokenizer_path,
        cache_dir=None,
    )
    # train's loss is megatron's: the embedding's padding rows (zeros) are logits of 0 in the softmax.
    model, losses = transformers_model(hf_llamas["untied"]), []
    padded = cfg.model.padded_vocab_size(VOCAB)
    with torch.no_grad():
        for batch in itertools.islice(
            sample_batches(valid, 0, *(s.global_batch_size,) * 2, 0, 1), s.eval_iters
        ):
            logits = F.pad(model(batch["tokens"]).logits, (0, padded - VOCAB))
            losses.append(F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten()).item())
    started = records(finetuned)
    assert started[0]["step"] == 0 and started[0]["val_loss"] == pytest.approx(
        sum(losses) / len(losses), rel=1e-5
    )
    assert [r["step"] for r in started if r["loss"] is not None] == [1, 2, 3, 4]
    assert (finetuned / "checkpoints" / "latest").read_text() == "iter_0000004\n"
    # The source's config.json travels with the fine-tuned checkpoints, for `convert --to-hf` to write back.
    record = checkpoint.read_record(finetuned / "checkpoints" / "iter_0000004")
    assert record.hf_config == json.loads((hf_llamas["untied"] / "config.json").read_text())


@pytest.mark.slow
def test_finetune_from_a_full_checkpoint_takes_only_its_weights(finetuned, converted, launcher, tiny_corpus):
    # From step 4 of the fine-tune above (with optimizer state), at TP=1 x PP=1: step and LR schedule start over.
    run_dir = launcher.base / "refinetune" / "run"
    recipe = str(converted["untied"] / "train.yaml")
    load = (f"checkpoint.load={finetuned / 'checkpoints'}", "parallel.pipeline_model_parallel_size=1")
    settings = as_args(finetune_settings(tiny_corpus, run_dir, 2, *load))
    output = launcher.run("refinetune", trainer("train", "--config", recipe, "--finetune", *settings))
    assert f"started from the weights in {finetuned / 'checkpoints' / 'iter_0000004'}" in output
    started = records(run_dir)
    assert started[0]["val_loss"] == pytest.approx(records(finetuned)[-1]["val_loss"], rel=1e-5)
    assert [(r["step"], r["lr"]) for r in started if r["loss"] is not None] == [
        (1, 0.0),
        (2, pytest.approx(1e-3)),
    ]


def test_the_runs_own_checkpoints_take_precedence_over_checkpoint_load(tiny_config, tmp_path):
    from trainer.checkpoint.start import Start, starting_checkpoint

    source, run_dir = tmp_path / "converted", tmp_path / "run"
    sealed_checkpoint(source / "iter_0000000")
    (source / "latest").write_text("iter_0000000\n")
    settings = [f"checkpoint.load={source}", "checkpoint.finetune=true", f"logging.run_dir={run_dir}"]
    cfg = load_config(tiny_config, settings)
    assert starting_checkpoint(cfg) == Start(source / "iter_0000000", weights_only=True, resumed=False)
    sealed_checkpoint(run_dir / "checkpoints" / "iter_0000002")  # the run has saved once: it resumes
    assert starting_checkpoint(cfg) == Start(
        run_dir / "checkpoints" / "iter_0000002", weights_only=False, resumed=True
    )
    # --fresh (which deletes them) and checkpoint.resume=false go back to checkpoint.load.
    assert starting_checkpoint(cfg, fresh=True).path == source / "iter_0000000"
    assert (
        starting_checkpoint(load_config(tiny_config, [*settings, "checkpoint.resume=false"])).resumed is False
    )


def test_fused_weights_follow_megatrons_layout():
    from trainer.config import ModelConfig
    from trainer.interop.hf import _rules

    m = ModelConfig(
        num_layers=1,
        hidden_size=4,
        ffn_hidden_size=3,
        num_attention_heads=4,
        num_query_groups=2,
        kv_channels=1,
        vocab_size=5,
        make_vocab_size_divisible_by=4,
    )
    rules = _rules(m)
    q, k, v = (
        torch.arange(rows * 4.0).view(rows, 4) + offset for rows, offset in ((4, 0), (2, 100), (2, 200))
    )
    qkv = rules["decoder.layers.0.self_attention.linear_qkv.weight"]
    # per query group: its two query heads, its key head, its value head (head dim 1: one row each)
    assert torch.equal(qkv.fuse([q, k, v]), torch.cat([q[0:2], k[0:1], v[0:1], q[2:4], k[1:2], v[1:2]]))
    assert all(torch.equal(a, b) for a, b in zip(qkv.split(qkv.fuse([q, k, v])), (q, k, v), strict=True))
    gate, up = torch.zeros(3, 4), torch.ones(3, 4)
    assert torch.equal(
        rules["decoder.layers.0.mlp.linear_fc1.weight"].fuse([gate, up]), torch.cat([gate, up])
    )
    embedding = rules["embedding.word_embeddings.weight"]
    padded = embedding.fuse([torch.ones(5, 4)])
    assert padded.shape == (8, 4) and padded[5:].eq(0).all() and embedding.split(padded)[0].shape == (5, 4)


def edit_config(directory: Path, **changes) -> None:
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps(config | changes))


@pytest.fixture
def no_launch(monkeypatch):
    """Verbs run in this process must refuse before starting torchrun (which would replace or outlive pytest)."""
    from trainer.distributed import local as standalone

    def refuse(*args, **kwargs):
        raise AssertionError("the verb passed its checks and tried to start torchrun")

    monkeypatch.setattr(standalone, "exec_torchrun", refuse)  # convert, score
    monkeypatch.setattr(standalone, "run_torchrun", refuse)  # train


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}), "rope type 'yarn'"),
        (
            dict(rope_parameters=LLAMA3_ROPE | {"high_freq_factor": 2.0}),
            "llama3 rope high_freq_factor = 2.0: megatron-core implements 4.0 only",
        ),
        (dict(attention_bias=True), "attention_bias = True is not supported"),
        (dict(hidden_act="gelu"), "hidden_act = 'gelu' is not supported"),
        (dict(model_type="mistral"), "only Llama"),
        (dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.5}), "rope_theta = 10000.5"),
        (dict(num_hidden_layers=5), "missing tensors: model.layers.4."),
        (
            dict(intermediate_size=32),
            "model.layers.0.mlp.down_proj.weight has shape (32, 64), config.json implies (32, 32)",
        ),
    ],
)
def test_convert_refuses_what_it_cannot_represent_before_starting(
    change, message, hf_llamas, tmp_path, no_launch, capsys
):
    import shutil

    source = tmp_path / "model"
    shutil.copytree(hf_llamas["tied"], source)
    edit_config(source, **change)
    assert trainer_main(["convert", "--from-hf", str(source), "--out", str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_convert_refuses_missing_files_and_an_existing_output(hf_llamas, tmp_path, no_launch, capsys):
    import shutil

    source = tmp_path / "model"
    shutil.copytree(hf_llamas["tied"], source)
    (source / "model.safetensors").rename(source / "pytorch_model.bin")
    for args, message in (
        (["--from-hf", str(tmp_path / "none")], "is not a directory"),
        (
            ["--from-hf", str(source)],
            "neither model.safetensors nor model.safetensors.index.json (found pytorch_model.bin",
        ),
        (["--from-hf", str(hf_llamas["tied"]), "--out", str(source)], f"--out {source} exists"),
        (["--to-hf", str(tmp_path)], "holds no checkpoint"),
        (
            ["--from-hf", str(hf_llamas["tied"]), "--tp", "3"],
            "model.num_attention_heads = 4 is not divisible by",
        ),
    ):
        args = args if "--out" in args else [*args, "--out", str(tmp_path / "out")]
        assert trainer_main(["convert", *args]) == 2
        assert message in capsys.readouterr().err


def test_bias_tensors_are_refused(hf_llamas, tmp_path, no_launch, capsys):
    from safetensors.torch import save_file

    source = tmp_path / "model"
    source.mkdir()
    tensors = load_file(hf_llamas["tied"] / "model.safetensors")
    save_file(
        tensors | {"model.layers.0.self_attn.q_proj.bias": torch.zeros(32)}, source / "model.safetensors"
    )
    (source / "config.json").write_text((hf_llamas["tied"] / "config.json").read_text())
    assert trainer_main(["convert", "--from-hf", str(source), "--out", str(tmp_path / "out")]) == 2
    assert (
        "no place for (biases? another architecture?): model.layers.0.self_attn.q_proj.bias"
        in capsys.readouterr().err
    )


@pytest.mark.slow
def test_train_refuses_a_checkpoint_of_another_model_before_starting(
    converted, tiny_corpus, tmp_path, no_launch, capsys
):
    recipe = str(converted["untied"] / "train.yaml")
    settings = as_args(finetune_settings(tiny_corpus, tmp_path / "run", 2, "model.ffn_hidden_size=128"))
    assert trainer_main(["train", "--config", recipe, *settings]) == 2
    error = capsys.readouterr().err
    assert "holds another model: model.ffn_hidden_size = 128 in the config, 64 in the checkpoint" in error


def test_train_refuses_a_missing_checkpoint_load_and_finetune_without_one(
    tiny_config, tmp_path, no_launch, capsys
):
    missing = tmp_path / "nothing"
    settings = as_args([f"checkpoint.load={missing}", f"logging.run_dir={tmp_path / 'run'}"])
    assert trainer_main(["train", "--config", str(tiny_config), *settings]) == 2
    assert f"checkpoint.load = '{missing}': checkpoint '{missing}' does not exist" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"checkpoint\.finetune = true needs checkpoint\.load"):
        load_config(tiny_config, ["checkpoint.finetune=true"])


@pytest.mark.slow
def test_score_refuses_tokens_outside_the_vocabulary(converted, tmp_path, no_launch, capsys):
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps([[1, 2, 3], [4, VOCAB]]))
    assert trainer_main(["score", "--checkpoint", str(converted["tied"]), "--tokens", str(tokens)]) == 2
    assert (
        f"sequence 1 holds token id {VOCAB}, outside the model's vocabulary (0..{VOCAB - 1})"
        in capsys.readouterr().err
    )


def test_score_data_windows_are_the_token_stream_in_file_order(tiny_corpus):
    import numpy as np
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    from trainer.evaluation.score import _windows

    stream = np.memmap(tiny_corpus + ".bin", dtype=IndexedDataset(tiny_corpus).index.dtype, mode="r")
    windows = _windows(Namespace(data=tiny_corpus, samples=3, seq_length=None), 16)
    assert windows == [stream[i * 16 : i * 16 + 17].tolist() for i in range(3)]
