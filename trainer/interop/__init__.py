"""Other formats in and out: Hugging Face Llama checkpoints and DeepSpeed's, through full weights.

hf          Hugging Face Llama (`config.json` + safetensors) <-> full weights, tensor by tensor
export      what an export for serving holds besides the weights: tokenizer with its chat template,
            generation_config.json, the model card
convert     `python -m trainer convert`: HF or DeepSpeed <-> trainer checkpoints, and a fine-tune recipe
"""
