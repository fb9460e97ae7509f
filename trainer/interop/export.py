"""What an export for inference holds besides config.json and the safetensors (trainer/interop/hf.py): the files a
server reads, and a model card with the model's lineage.

    generation_config.json   the ids that end generation: the end-of-text token and the chat template's end-of-turn
                             token where that is another (Llama 3 Instruct's lists 128001 and 128009); the
                             beginning-of-text id, where the tokenizer has one
    tokenizer.json           the model's tokenizer (the run's data.tokenizer_path, or a converted model's)
    tokenizer_config.json    PreTrainedTokenizerFast, its special tokens and the chat template: the one the run's
                             chat data was rendered with (its PREFIX.chat.json, trainer/data/chat.py), else the
                             tokenizer's own where one came with it, else the built-in one
                             (trainer/data/chat_template.py)
    README.md                the model card: lineage, metrics and evaluations from the model version record

These follow what transformers and vLLM read from a model directory: vLLM builds its config and tokenizer with
transformers' AutoConfig and AutoTokenizer, reads generation_config.json through GenerationConfig.from_pretrained
(vllm/transformers_utils/config.py try_get_generation_config) and loads every `*.safetensors`, filtered by
model.safetensors.index.json where there is one (vllm/model_executor/model_loader/default_loader.py
_prepare_weights).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from trainer.checkpoint.version import ModelVersion
from trainer.data.chat import ChatTemplate
from trainer.data.chat_template import CHAT_TEMPLATE
from trainer.data.tokenizer import BOS_CANDIDATES, EOD_CANDIDATES, read_tokenizer

GENERATION_CONFIG = "generation_config.json"
TOKENIZER = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
MODEL_CARD = "README.md"


@dataclass(frozen=True)
class SpecialTokens:
    eos: str
    eos_id: int
    bos: str | None
    bos_id: int | None
    end_of_turn_id: int | None = None  # the chat template's, where it is not the end-of-text token

    @property
    def stop_ids(self) -> list[int]:
        """Every id that ends generation, the end-of-text one first."""
        return [self.eos_id, *([self.end_of_turn_id] if self.end_of_turn_id is not None else [])]


def special_tokens(tokenizer_path: Path, template: ChatTemplate | None = None) -> SpecialTokens:
    """The tokenizer's end-of-text token (the first of trainer/data/tokenizer.py's EOD_CANDIDATES it has), its
    beginning-of-text token, if any, and the template's end-of-turn token where it is another."""
    tokenizer = read_tokenizer(tokenizer_path)
    vocabulary = tokenizer.get_vocab(with_added_tokens=True)
    eos = next((token for token in EOD_CANDIDATES if token in vocabulary), None)
    if eos is None:
        raise ValueError(
            f"tokenizer {tokenizer_path} has no end-of-text token: expected one of {', '.join(EOD_CANDIDATES)}"
        )
    bos = next((token for token in BOS_CANDIDATES if token in vocabulary), None)
    turn = template.end_of_turn() if template is not None else None
    end_of_turn_id = vocabulary[turn] if turn is not None and turn != eos and turn in vocabulary else None
    return SpecialTokens(eos, vocabulary[eos], bos, vocabulary[bos] if bos else None, end_of_turn_id)


def write_tokenizer(
    directory: Path, tokenizer_path: Path, max_length: int, template: ChatTemplate | None = None
) -> SpecialTokens:
    """tokenizer.json and tokenizer_config.json: the source's config where it has one beside it (a converted
    model's), else PreTrainedTokenizerFast with the built-in chat template; `template`, the one the model was
    fine-tuned with, replaces either's."""
    tokens = special_tokens(tokenizer_path, template)
    shutil.copyfile(tokenizer_path, directory / TOKENIZER)
    own = tokenizer_path.with_name(TOKENIZER_CONFIG)
    if own.is_file():
        config = json.loads(own.read_text())
    else:
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "eos_token": tokens.eos,
            "pad_token": tokens.eos,  # batched generation pads; the end-of-text token is never attended past
            "model_max_length": max_length,
            "clean_up_tokenization_spaces": False,
            "chat_template": CHAT_TEMPLATE,
        }
        if tokens.bos:
            config["bos_token"] = tokens.bos
    if template is not None:
        config["chat_template"] = template.source
    (directory / TOKENIZER_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    return tokens


def generation_config(tokens: SpecialTokens) -> dict:
    """generation_config.json: generation stops at the end-of-text token and the end-of-turn token (transformers
    GenerationConfig keys; transformers stops only on its eos_token_id, a list where several end it)."""
    stop = tokens.stop_ids
    config: dict = {"eos_token_id": stop if len(stop) > 1 else stop[0], "pad_token_id": tokens.eos_id}
    if tokens.bos_id is not None:
        config["bos_token_id"] = tokens.bos_id
    return config


def model_card(
    name: str, dtype_name: str, version: ModelVersion | None, evaluations: list[dict], has_chat_template: bool
) -> str:
    """README.md: YAML metadata, then the lineage, metrics and evaluations the model version record holds (the
    Hub's model card layout: README.md opening with a `---` YAML block, Hugging Face docs "Model Cards")."""
    lines = [
        "---",
        "library_name: transformers",
        "pipeline_tag: text-generation",
        "tags: [llama, trainstack]",
    ]
    lines += ["---", "", f"# {name}", ""]
    lines += [f"A Llama-architecture causal language model exported by trainstack in {dtype_name}.", ""]
    lines += ["## Lineage", ""]
    if version is None:
        lines += ["No model version record: this checkpoint was not published by a training run.", ""]
    else:
        image = f"{version.image.tag} {version.image.digest or ''}".strip() if version.image else "-"
        parent = (version.parent.version or version.parent.checkpoint) if version.parent else "-"
        rows = [
            ("version", version.version),
            ("run, step", f"{version.run}, {version.step}"),
            ("created", version.created),
            ("checkpoint", version.checkpoint),
            ("checkpoint manifest sha256", version.manifest_sha256),
            (
                "git commit",
                (version.git_commit or "-") + (" (uncommitted changes)" if version.git_dirty else ""),
            ),
            ("image", image),
            ("parent", parent),
            ("config sha256", version.config_sha256),
            ("tokenizer sha256", version.tokenizer_sha256),
            *((f"dataset {d.prefix} sha256", d.sha256) for d in version.datasets),
            ("lineage sha256", version.lineage_sha256),
        ]
        lines += ["| | |", "|---|---|", *(f"| {key} | `{value}` |" for key, value in rows), ""]
        lines += ["## Metrics", ""]
        metrics = version.metrics or {}
        lines += [f"- {key}: {value:.6g}" for key, value in sorted(metrics.items())] or ["- none recorded"]
        lines += [""]
    lines += ["## Evaluation results", ""]
    if evaluations:
        lines += ["| evaluation | metric | value |", "|---|---|---|"]
        for entry in evaluations:
            for metric, value in sorted(entry["results"].items()):
                lines.append(f"| {entry['name']} | {metric} | {value} |")
    else:
        lines += ["None recorded yet."]
    lines += [
        "",
        "## Use",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
    ]
    lines += [
        'model = AutoModelForCausalLM.from_pretrained("PATH")',
        'tokenizer = AutoTokenizer.from_pretrained("PATH")',
    ]
    if has_chat_template:
        # transformers 5 returns a BatchEncoding from apply_chat_template (return_dict defaults to True):
        # tokenization_utils_base.py apply_chat_template, 5.24.0.
        lines += [
            'messages = [{"role": "user", "content": "Hi"}]',
            'inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")',
        ]
    else:
        lines += ['inputs = tokenizer("Hi", return_tensors="pt")']
    lines += [
        "output = model.generate(**inputs, max_new_tokens=32)",
        'print(tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True))',
    ]
    lines += ["```", "", "vLLM serves the same directory: `vllm serve PATH`.", ""]
    return "\n".join(lines)
