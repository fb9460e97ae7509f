"""Every config mistake is caught before any process starts work, with the key, the value and what is valid."""

from pathlib import Path

import pytest
import yaml

from trainer.config import ConfigError, ParallelDims, layout_problems, load_config
from trainer.data.datasets import data_problems
from trainer.data.tokenizer import train_bpe

CONFIGS = Path(__file__).resolve().parents[2] / "trainer" / "configs"
LOCAL = CONFIGS / "local.yaml"


def local(*overrides: str):
    return load_config(LOCAL, list(overrides))


def problems_of(*overrides: str) -> str:
    with pytest.raises(ConfigError) as error:
        local(*overrides)
    return str(error.value)


def test_local_config_runs_tp2_pp2_on_four_cpu_processes():
    cfg = local()
    assert (cfg.parallel.tensor_model_parallel_size, cfg.parallel.pipeline_model_parallel_size) == (2, 2)
    assert layout_problems(cfg, 4, "cpu") == []
    assert cfg.name == "local" and cfg.run_dir == Path("runs/local")
    assert cfg.checkpoint_dir == Path("runs/local/checkpoints")


@pytest.mark.parametrize(("config", "nodes"), [("llama3-8b.yaml", 4), ("llama3-70b.yaml", 32)])
def test_production_recipes_fit_the_node_counts_their_comments_state(config, nodes):
    cfg = load_config(CONFIGS / config)
    assert layout_problems(cfg, nodes * 8, "cuda") == []  # p5.48xlarge: 8 GPUs a node
    assert (
        cfg.parallel.sequence_parallel and cfg.parallel.use_distributed_optimizer and cfg.precision == "bf16"
    )


def test_heads_not_divisible_by_tp_names_both_keys():
    message = layout_problems(local("parallel.tensor_model_parallel_size=3"), 3, "cpu")[0]
    assert (
        "model.num_attention_heads = 4 is not divisible by parallel.tensor_model_parallel_size = 3" in message
    )


def test_query_groups_not_divisible_by_tp():
    problems = layout_problems(local("model.num_query_groups=1"), 2, "cpu")
    assert any(
        "model.num_query_groups = 1 is not divisible by parallel.tensor_model_parallel_size = 2" in p
        for p in problems
    )


def test_layers_not_divisible_by_pipeline_stages_times_virtual_stages():
    problems = layout_problems(local("parallel.virtual_pipeline_model_parallel_size=3"), 4, "cpu")
    assert any(
        "model.num_layers = 4 is not divisible by parallel.pipeline_model_parallel_size x "
        "parallel.virtual_pipeline_model_parallel_size = 2 x 3 = 6" in p
        for p in problems
    )


def test_world_size_other_than_tp_pp_dp_says_what_to_launch():
    with pytest.raises(ConfigError) as error:
        ParallelDims.from_config(local("parallel.data_parallel_size=2").parallel, 4)
    assert "world size 4 != parallel.tensor_model_parallel_size x pipeline_model_parallel_size x " in str(
        error.value
    )
    assert "= 2 x 2 x 2 = 8; launch 8 processes" in str(error.value)


def test_world_size_not_a_multiple_of_the_model_parallel_size():
    assert (
        "world size 6 is not divisible by parallel.tensor_model_parallel_size x "
        in layout_problems(local(), 6, "cpu")[0]
    )


def test_global_batch_not_divisible_by_micro_batch_times_dp():
    problems = layout_problems(
        local("schedule.micro_batch_size=8", "schedule.global_batch_size=24"), 8, "cpu"
    )
    assert problems == [
        "schedule.global_batch_size = 24 is not divisible by schedule.micro_batch_size x data parallel size = 8 x 2"
    ]


def test_interleaved_schedule_needs_micro_batches_in_multiples_of_pp():
    cfg = local(
        "model.num_layers=8",
        "parallel.virtual_pipeline_model_parallel_size=2",
        "schedule.micro_batch_size=8",
        "schedule.global_batch_size=24",  # 3 micro-batches
    )
    assert (
        "to be a multiple of parallel.pipeline_model_parallel_size = 2" in layout_problems(cfg, 4, "cpu")[0]
    )


def test_sequence_parallel_on_cpu_says_it_needs_gpus():
    problems = layout_problems(local("parallel.sequence_parallel=true"), 4, "cpu")
    assert problems == [
        "parallel.sequence_parallel = true cannot run on CPU: megatron-core's local layer spec refuses it without "
        "TransformerEngine; set it to false here (it works on GPUs)"
    ]
    assert layout_problems(local("parallel.sequence_parallel=true"), 4, "cuda") == []


def test_missing_data_path_says_how_to_prepare_it(tmp_path):
    tokenizer = tmp_path / "tokenizer.json"
    train_bpe(["def f(x):\n    return x\n"], 300).save(str(tokenizer))
    problems = data_problems(local(f"data.prefixes=[{tmp_path}/corpus]", f"data.tokenizer_path={tokenizer}"))
    assert problems == [
        f"data.prefixes[0] = '{tmp_path}/corpus': dataset '{tmp_path}/corpus' not found: no {tmp_path}/corpus.bin "
        f"or {tmp_path}/corpus.idx; create it with `python -m trainer prepare INPUT... --output {tmp_path}/corpus`"
    ]


def test_missing_tokenizer_is_named(tmp_path):
    problems = data_problems(local(f"data.tokenizer_path={tmp_path}/tokenizer.json"))
    assert problems == [
        f"data.tokenizer_path = '{tmp_path}/tokenizer.json': tokenizer '{tmp_path}/tokenizer.json' "
        "does not exist (give a Hugging Face tokenizer.json)"
    ]


def test_unknown_yaml_key_suggests_the_nearest_valid_one(tmp_path):
    raw = yaml.safe_load(LOCAL.read_text())
    raw["model"]["hiden_size"] = raw["model"].pop("hidden_size")
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert "unknown key 'model.hiden_size'; did you mean 'model.hidden_size'?" in str(error.value)
    assert "model.hidden_size is required but missing" in str(error.value)
    assert str(path) in str(error.value)


def test_unknown_override_key_suggests_the_nearest_valid_one():
    assert (
        "unknown key 'parallel.tensor_parallel_size'; did you mean 'parallel.tensor_model_parallel_size'?"
        in (problems_of("parallel.tensor_parallel_size=2"))
    )


def test_unknown_section_lists_the_sections():
    assert "unknown key 'paralel'; did you mean 'parallel'?" in problems_of("paralel.x=1")


def test_bad_choice_lists_the_valid_ones():
    assert "parallel.recompute = 'some': Input should be 'none', 'selective' or 'full'" in problems_of(
        "parallel.recompute=some"
    )


def test_override_values_are_typed_by_the_field():
    cfg = local("optimizer.lr=3e-3", "schedule.lr_decay_iters=null", "data.prefixes=[a, b]", "name=123")
    assert cfg.optimizer.lr == 0.003 and cfg.schedule.lr_decay_iters is None
    assert cfg.data.prefixes == ["a", "b"] and cfg.name == "123"


def test_wrong_type_names_key_and_value():
    assert "schedule.train_iters = 'many': Input should be a valid integer" in problems_of(
        "schedule.train_iters=many"
    )


def test_warmup_must_end_before_the_decay_does():
    assert "schedule.lr_warmup_iters = 500 must be below the decay length" in problems_of(
        "schedule.lr_warmup_iters=500"
    )


def test_head_count_must_split_into_query_groups():
    assert "model.num_attention_heads = 4 is not divisible by model.num_query_groups = 3" in problems_of(
        "model.num_query_groups=3"
    )


def test_keeping_no_checkpoint_is_refused():
    assert "checkpoint.keep_last = 0: Input should be greater than 0" in problems_of("checkpoint.keep_last=0")


def test_config_module_imports_neither_torch_nor_megatron():
    import subprocess
    import sys

    code = "import sys, trainer.config; print('torch' in sys.modules or 'megatron' in sys.modules)"
    root = Path(__file__).resolve().parents[2]
    assert (
        subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True).stdout.strip()
        == "False"
    )


def test_the_sft_recipes_pack_one_chat_dataset_one_sample_per_micro_batch():
    for name in ("sft-local.yaml", "llama3-8b-sft.yaml"):
        cfg = load_config(CONFIGS / name, device="cpu")
        assert cfg.data.format == "chat" and cfg.schedule.micro_batch_size == 1 and cfg.checkpoint.finetune
    assert layout_problems(load_config(CONFIGS / "sft-local.yaml"), 4, "cpu") == []


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("schedule.micro_batch_size=2", "data.format = 'chat' needs schedule.micro_batch_size = 1 (got 2)"),
        ("engine=deepspeed", "data.format = 'chat' needs engine = 'megatron' (got 'deepspeed')"),
        ("data.prefixes=[a,b]", "data.format = 'chat' packs one chat dataset; data.prefixes has 2"),
    ],
)
def test_chat_data_refuses_what_packed_samples_cannot_run(override, message):
    with pytest.raises(ConfigError) as error:
        load_config(CONFIGS / "sft-local.yaml", [override, "schedule.global_batch_size=4"])
    assert message in str(error.value)
