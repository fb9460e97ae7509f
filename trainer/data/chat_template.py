"""The chat template of the project's own BPE tokenizer (trainer/data/tokenizer.py), which has none of its own: the
text `prepare --format chat` renders conversations with (trainer/data/chat.py) and that exports write into
tokenizer_config.json (trainer/interop/export.py), so that a model is served conversations formatted exactly as
it was fine-tuned on them.

Plain-text role markers, `<|role|>` and a newline before each message and a newline after it, the end-of-text
token after each assistant turn (a model learns to stop where its answer ends); with add_generation_prompt, an
open `<|assistant|>` turn. The Zephyr format, as transformers' chat-template guide shows it ("Advanced Usage and
Customizing Your Chat Templates"), with the end token on the assistant's turns only.
"""

from __future__ import annotations

# The roles a conversation may use: the OpenAI chat format's system/user/assistant (tool calls are not trained).
ROLES = ("system", "user", "assistant")

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{{ '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
