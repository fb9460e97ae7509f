"""Other formats in and out: Hugging Face Llama checkpoints and DeepSpeed's, through full weights.

hf          Hugging Face Llama (`config.json` + safetensors) <-> full weights, tensor by tensor
convert     `python -m trainer convert`: HF or DeepSpeed <-> trainer checkpoints, and a fine-tune recipe
"""
