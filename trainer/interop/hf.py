"""Hugging Face Llama checkpoints (`config.json` + safetensors) <-> full weights (trainer/model/weights.py).

Each full weight is made of Hugging Face tensors by one rule, and split back by its inverse:

    embedding.word_embeddings.weight          model.embed_tokens.weight            rows padded with zeros
    output_layer.weight (untied only)         lm_head.weight                       rows padded with zeros
    decoder.final_layernorm.weight            model.norm.weight
    decoder.layers.i.input_layernorm.weight   model.layers.i.input_layernorm.weight
    ...pre_mlp_layernorm.weight               ...post_attention_layernorm.weight
    ...self_attention.linear_qkv.weight       ...self_attn.{q,k,v}_proj.weight     per query group: [its q heads; k; v]
    ...self_attention.linear_proj.weight      ...self_attn.o_proj.weight
    ...mlp.linear_fc1.weight                  ...mlp.{gate,up}_proj.weight         [gate; up]
    ...mlp.linear_fc2.weight                  ...mlp.down_proj.weight

Rotary embeddings need no permutation: Hugging Face's Llama rotates halves (`rotate_half`), as megatron does with
`rotary_interleaved=False`. Only what the trainer's model computes identically is accepted; everything else is
refused before any tensor is read, naming the key and what would be valid. This module imports no megatron-core.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from trainer.config import ModelConfig

CONFIG = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX = "model.safetensors.index.json"
ARCHITECTURE = "LlamaForCausalLM"
# Config keys whose only value the trainer's Llama computes with (absent keys take it by default).
_MUST_EQUAL = {
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "attention_dropout": 0.0,
    "pretraining_tp": 1,
}
_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
# The short names people serve with (`--dtype bf16`), for the names config.json's `dtype` holds.
DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
# Old transformers versions stored the rotary frequencies; they are recomputed from rope_theta.
_IGNORED = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")


class HuggingFaceError(ValueError):
    """A Hugging Face checkpoint this converter cannot represent exactly, or cannot read."""


def model_config(hf_config: dict, source: str = CONFIG) -> ModelConfig:
    """The trainer's model section for a Llama `config.json`; refuses what the trainer's model would compute
    differently (biases, other activations, rope scaling, dropout, quantization)."""
    problems = []
    architectures = hf_config.get("architectures") or [ARCHITECTURE]
    if hf_config.get("model_type", "llama") != "llama" or architectures != [ARCHITECTURE]:
        problems.append(
            f"model_type = {hf_config.get('model_type')!r}, architectures = {architectures}: only Llama "
            f"(model_type 'llama', {ARCHITECTURE}) converts"
        )
    for key, wanted in _MUST_EQUAL.items():
        if key in hf_config and hf_config[key] != wanted:
            problems.append(
                f"{key} = {hf_config[key]!r} is not supported; the trainer's Llama has {wanted!r}"
            )
    if hf_config.get("quantization_config"):
        problems.append(
            "quantization_config is set: quantized checkpoints do not convert; use the full weights"
        )
    theta, scaling_factor, rope_problems = _rope(hf_config)
    problems += rope_problems
    missing = [
        key
        for key in (
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "vocab_size",
        )
        if not isinstance(hf_config.get(key), int)
    ]
    if missing:
        problems.append(f"{', '.join(missing)} missing or not an integer")
    if problems:
        raise HuggingFaceError(f"{source}: " + "; ".join(problems))
    heads = hf_config["num_attention_heads"]
    head_dim = hf_config.get("head_dim") or hf_config["hidden_size"] // heads
    try:
        return ModelConfig(
            num_layers=hf_config["num_hidden_layers"],
            hidden_size=hf_config["hidden_size"],
            ffn_hidden_size=hf_config["intermediate_size"],
            num_attention_heads=heads,
            num_query_groups=hf_config.get("num_key_value_heads") or heads,
            kv_channels=head_dim,
            vocab_size=hf_config["vocab_size"],
            rotary_base=theta,
            rope_scaling_factor=scaling_factor,
            norm_epsilon=hf_config.get("rms_norm_eps", 1e-6),
            init_method_std=hf_config.get("initializer_range", 0.02),
            share_embeddings_and_output_weights=hf_config.get("tie_word_embeddings", False),
        )
    except ValueError as error:  # pydantic's ValidationError, or a ConfigError from its consistency checks
        raise HuggingFaceError(f"{source}: does not describe a valid model: {error}") from None


# Llama 3.1's rope scaling as megatron-core implements it: only the factor may vary.
_LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def _rope(hf_config: dict) -> tuple[int, float | None, list[str]]:
    """rope_theta and the Llama 3.1 scaling factor (None: unscaled), from transformers 5's `rope_parameters` or
    the older top-level `rope_theta` and `rope_scaling`; problems for what megatron-core's rope cannot do."""
    parameters = hf_config.get("rope_parameters") or hf_config.get("rope_scaling") or {}
    rope_type = parameters.get("rope_type", parameters.get("type", "default"))
    theta = parameters.get("rope_theta", hf_config.get("rope_theta", 10000.0))
    problems = []
    if not isinstance(theta, int | float) or theta <= 0 or theta != int(theta):
        problems.append(
            f"rope_theta = {theta!r}: the trainer's model.rotary_base takes a positive whole number"
        )
        theta = 0  # never used: the problem stops the conversion
    if rope_type == "default":
        return int(theta), None, problems
    if rope_type != "llama3":
        problems.append(
            f"rope type {rope_type!r} (rope_parameters / rope_scaling) is not supported; 'default' and 'llama3' are"
        )
        return 0, None, problems
    for key, wanted in _LLAMA3_ROPE.items():
        if parameters.get(key) != wanted:
            problems.append(
                f"llama3 rope {key} = {parameters.get(key)!r}: megatron-core implements {wanted} only"
            )
    factor = parameters.get("factor")
    if not isinstance(factor, int | float) or factor <= 0:
        problems.append(f"llama3 rope factor = {factor!r}: give a positive number")
    return int(theta), factor, problems


def to_hf_config(model: ModelConfig, base: dict | None, dtype: torch.dtype, max_positions: int) -> dict:
    """config.json for `model`: `base` (the one it was converted from, if any) with every architectural key set."""
    config = dict(
        base or {"bos_token_id": None, "eos_token_id": None, "max_position_embeddings": max_positions}
    )
    config.pop("rope_theta", None)
    config.pop("rope_scaling", None)
    config.pop("torch_dtype", None)  # transformers 5 writes `dtype`
    config.update(
        architectures=[ARCHITECTURE],
        model_type="llama",
        hidden_size=model.hidden_size,
        intermediate_size=model.ffn_hidden_size,
        num_hidden_layers=model.num_layers,
        num_attention_heads=model.num_attention_heads,
        num_key_value_heads=model.query_groups,
        head_dim=model.head_dim,
        vocab_size=model.vocab_size,
        rms_norm_eps=model.norm_epsilon,
        initializer_range=model.init_method_std,
        tie_word_embeddings=model.share_embeddings_and_output_weights,
        rope_parameters=_rope_parameters(model),
        dtype=DTYPE_NAMES[dtype],
        **_MUST_EQUAL,
    )
    return dict(sorted(config.items()))


def _rope_parameters(model: ModelConfig) -> dict:
    theta = {"rope_theta": float(model.rotary_base)}
    if model.rope_scaling_factor is None:
        return {"rope_type": "default", **theta}
    return {"rope_type": "llama3", **theta, "factor": model.rope_scaling_factor, **_LLAMA3_ROPE}


@dataclass(frozen=True)
class _Rule:
    """How one full weight is made of Hugging Face tensors (`fuse`) and split back (`split`)."""

    hf_names: tuple[str, ...]
    hf_shapes: tuple[tuple[int, ...], ...]  # what config.json implies for each
    fuse: Callable[[list[torch.Tensor]], torch.Tensor]
    split: Callable[[torch.Tensor], list[torch.Tensor]]


def _rules(model: ModelConfig) -> dict[str, _Rule]:
    """Every full weight of `model`, in the order megatron builds them, with its Hugging Face tensors."""
    h, f, d, vocab = model.hidden_size, model.ffn_hidden_size, model.head_dim, model.vocab_size
    groups, heads = model.query_groups, model.num_attention_heads
    assert (
        vocab is not None
    )  # converted models carry their vocabulary (a checkpoint record, or config.json's)
    padded_vocab_size = model.padded_vocab_size(vocab)

    def same(tensors):
        return tensors[0]

    def unchanged(tensor):
        return [tensor]

    def pad_vocab(tensors):
        (tensor,) = tensors
        return torch.cat([tensor, tensor.new_zeros(padded_vocab_size - vocab, h)])

    def strip_vocab(tensor):
        return [tensor[:vocab]]

    def fuse_qkv(tensors):
        q, k, v = (t.reshape(groups, -1, h) for t in tensors)  # [groups, rows of each group, hidden]
        return torch.cat([q, k, v], dim=1).reshape(-1, h)

    def split_qkv(tensor):
        grouped = tensor.reshape(groups, (heads // groups + 2) * d, h)
        q, k, v = grouped.split([heads // groups * d, d, d], dim=1)
        return [part.reshape(-1, h) for part in (q, k, v)]

    def fuse_gate_up(tensors):
        return torch.cat(tensors)

    def split_gate_up(tensor):
        return list(tensor.chunk(2))

    def norm(hf_name):
        return _Rule((hf_name,), ((h,),), same, unchanged)

    rules = {
        "embedding.word_embeddings.weight": _Rule(
            ("model.embed_tokens.weight",), ((vocab, h),), pad_vocab, strip_vocab
        )
    }
    for i in range(model.num_layers):
        ours, theirs = f"decoder.layers.{i}.", f"model.layers.{i}."
        rules |= {
            ours + "input_layernorm.weight": norm(theirs + "input_layernorm.weight"),
            ours + "self_attention.linear_qkv.weight": _Rule(
                tuple(f"{theirs}self_attn.{p}_proj.weight" for p in "qkv"),
                ((heads * d, h), (groups * d, h), (groups * d, h)),
                fuse_qkv,
                split_qkv,
            ),
            ours + "self_attention.linear_proj.weight": _Rule(
                (theirs + "self_attn.o_proj.weight",), ((h, heads * d),), same, unchanged
            ),
            ours + "pre_mlp_layernorm.weight": norm(theirs + "post_attention_layernorm.weight"),
            ours + "mlp.linear_fc1.weight": _Rule(
                (theirs + "mlp.gate_proj.weight", theirs + "mlp.up_proj.weight"),
                ((f, h), (f, h)),
                fuse_gate_up,
                split_gate_up,
            ),
            ours + "mlp.linear_fc2.weight": _Rule(
                (theirs + "mlp.down_proj.weight",), ((h, f),), same, unchanged
            ),
        }
    rules["decoder.final_layernorm.weight"] = norm("model.norm.weight")
    if not model.share_embeddings_and_output_weights:
        rules["output_layer.weight"] = _Rule(("lm_head.weight",), ((vocab, h),), pad_vocab, strip_vocab)
    return rules


class HuggingFaceCheckpoint:
    """A Llama directory opened for reading: config.json checked, every safetensors header checked against it.
    Tensors are read only when a full weight asks for them, so each rank reads only its own stage's."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        config_path = self.directory / CONFIG
        if not self.directory.is_dir():
            raise HuggingFaceError(
                f"{str(self.directory)!r} is not a directory (give a Hugging Face model directory)"
            )
        if not config_path.is_file():
            raise HuggingFaceError(
                f"{config_path} not found: a Hugging Face model directory has a config.json"
            )
        try:
            self.hf_config = json.loads(config_path.read_text())
        except json.JSONDecodeError as error:
            raise HuggingFaceError(f"{config_path} is not valid JSON: {error}") from None
        self.model = model_config(self.hf_config, str(config_path))
        self._files = self._weight_files()
        self.dtype = self._check_tensors()

    def _weight_files(self) -> dict[str, Path]:
        """Tensor name -> the safetensors file holding it (one file, or shards listed in an index)."""
        index, single = self.directory / INDEX, self.directory / SINGLE_FILE
        if index.is_file():
            weight_map = json.loads(index.read_text()).get("weight_map")
            if not isinstance(weight_map, dict):
                raise HuggingFaceError(f"{index} has no weight_map")
            files = {name: self.directory / file for name, file in weight_map.items()}
            absent = sorted({str(path) for path in files.values() if not path.is_file()})
            if absent:
                raise HuggingFaceError(f"{index} lists shards that are missing: {', '.join(absent)}")
            return files
        if single.is_file():
            with safe_open(single, framework="pt") as file:
                return dict.fromkeys(file.keys(), single)
        other = sorted(path.name for path in self.directory.glob("*.bin")) + sorted(
            path.name for path in self.directory.glob("*.pth")
        )
        hint = f" (found {', '.join(other)}: save the model with safetensors first)" if other else ""
        raise HuggingFaceError(f"{self.directory} has neither {SINGLE_FILE} nor {INDEX}{hint}")

    def _check_tensors(self) -> torch.dtype:
        """Every expected tensor present with its shape, nothing unexpected, one floating dtype; returns it."""
        expected = {
            name: shape
            for rule in _rules(self.model).values()
            for name, shape in zip(rule.hf_names, rule.hf_shapes, strict=True)
        }
        present = {name for name in self._files if not _IGNORED.fullmatch(name)}
        if self.model.share_embeddings_and_output_weights:
            present.discard("lm_head.weight")  # a tied model's copy; transformers ignores it too
        problems = []
        missing = sorted(set(expected) - present)
        if missing:
            problems.append(f"missing tensors: {_few(missing)}")
        unexpected = sorted(present - set(expected))
        if unexpected:
            problems.append(
                f"tensors the trainer's Llama has no place for (biases? another architecture?): {_few(unexpected)}"
            )
        dtypes = set()
        with ExitStack() as stack:
            opened = {}
            for name in sorted(present & set(expected)):
                path = self._files[name]
                if path not in opened:
                    opened[path] = stack.enter_context(safe_open(path, framework="pt"))
                tensor = opened[path].get_slice(name)
                if tuple(tensor.get_shape()) != expected[name]:
                    problems.append(
                        f"{name} has shape {tuple(tensor.get_shape())}, config.json implies {expected[name]}"
                    )
                dtypes.add(tensor.get_dtype())
        unsupported = sorted(dtypes - set(_DTYPES))
        if unsupported:
            problems.append(f"tensor dtypes {unsupported} are not supported ({', '.join(_DTYPES)} are)")
        elif len(dtypes) > 1:
            problems.append(f"tensors of several dtypes {sorted(dtypes)}: expected one")
        if problems:
            raise HuggingFaceError(f"{self.directory}: " + "; ".join(problems))
        return _DTYPES[dtypes.pop()]

    def full_weights(self) -> Callable[[str], torch.Tensor]:
        """A reader of full weights by name, each fused from the Hugging Face tensors it is made of."""
        rules = _rules(self.model)

        def read(name: str) -> torch.Tensor:
            rule = rules[name]
            tensors = []
            for hf_name in rule.hf_names:
                with safe_open(self._files[hf_name], framework="pt") as file:
                    tensors.append(file.get_tensor(hf_name))
            return rule.fuse(tensors)

        return read


def write(
    directory: Path,
    model: ModelConfig,
    full_weights: dict[str, torch.Tensor],
    hf_config: dict,
    dtype: torch.dtype,
    max_shard_bytes: int,
) -> None:
    """config.json and safetensors (sharded with an index beyond max_shard_bytes) into an existing directory."""
    rules = _rules(model)
    unknown = sorted(set(full_weights) - set(rules))
    if unknown or len(full_weights) != len(rules):
        raise HuggingFaceError(
            f"the weights do not form the model in the config: unknown {_few(unknown)}, "
            f"missing {_few(sorted(set(rules) - set(full_weights)))}"
        )
    tensors = {}
    overflows = []
    for name, rule in rules.items():
        parts = rule.split(full_weights[name])
        for hf_name, part in zip(rule.hf_names, parts, strict=True):
            if (largest := _overflow(part, dtype)) is not None:
                overflows.append(f"{hf_name} (max |w| = {largest:.6g})")
            tensors[hf_name] = part.to(device="cpu", dtype=dtype).contiguous()
    if overflows:
        raise HuggingFaceError(
            f"--dtype {DTYPE_NAMES[dtype]}: {_few(overflows)} exceed its largest finite value "
            f"{torch.finfo(dtype).max:g} and would become inf; nothing was written. Export in bfloat16 or float32"
        )
    shards = list(_shards(tensors, max_shard_bytes))
    if len(shards) == 1:
        save_file(shards[0], directory / SINGLE_FILE, metadata={"format": "pt"})
    else:
        weight_map: dict[str, str] = {}
        for i, shard in enumerate(shards, start=1):
            file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, directory / file, metadata={"format": "pt"})
            weight_map |= dict.fromkeys(shard, file)
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (directory / INDEX).write_text(json.dumps(index, indent=2) + "\n")
    (directory / CONFIG).write_text(json.dumps(hf_config, indent=2) + "\n")


def _overflow(tensor: torch.Tensor, dtype: torch.dtype) -> float | None:
    """The largest magnitude in `tensor` when `dtype` cannot hold it (beyond its finite range, or not finite)."""
    largest = float(tensor.detach().abs().max().float()) if tensor.numel() else 0.0
    return largest if not largest <= torch.finfo(dtype).max else None


def _shards(tensors: dict[str, torch.Tensor], max_bytes: int) -> Iterator[dict[str, torch.Tensor]]:
    shard: dict[str, torch.Tensor] = {}
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shard and size + nbytes > max_bytes:
            yield shard
            shard, size = {}, 0
        shard[name], size = tensor, size + nbytes
    yield shard


_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}


def parse_size(text: str) -> int:
    """'5GB', '500MB', '20KB' or a byte count, as Hugging Face's max_shard_size."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(|B|[KMGT]B)", text.strip().upper())
    if match is None:
        raise ValueError(f"{text!r} is not a size; give e.g. 5GB, 500MB or a byte count")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def _few(names: list[str]) -> str:
    return (
        ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "") if names else "none"
    )
