"""The built-in chat set: conversations made from the standard library's sources, the same on every run, each
one a valid chat record with an answer to train on; one in HELD_OUT_EVERY held out as an evaluation task."""

import json

from trainer.data.chat import BUILTIN_TEMPLATE, ChatTemplate, read_conversations
from trainer.data.stdlib_chat import (
    HELD_OUT_EVERY,
    MAX_ANSWER_CHARS,
    SYSTEM,
    stdlib_conversations,
    write_stdlib_chat,
    write_stdlib_tasks,
)


def test_the_stdlib_chat_set_is_valid_chat_data_and_rewritten_only_when_it_changes(tmp_path):
    path = write_stdlib_chat(tmp_path / "chat.jsonl")
    written = path.stat().st_mtime_ns
    conversations = read_conversations([path])

    assert len(conversations) > 1000
    questions = {c.messages[-2]["content"]: c.messages[-1]["content"] for c in conversations}
    # os.path is posixpath on Linux; the answers are its docstring's first line and its signature as written.
    assert (
        questions["What does posixpath.join do?"]
        == "Join two or more pathname components, inserting '/' as needed."
    )
    assert questions["How do I call posixpath.join?"] == "def join(a, *p)"
    assert all(len(c.messages[-1]["content"]) <= MAX_ANSWER_CHARS for c in conversations)
    assert conversations[0].messages[0] == {"role": "system", "content": SYSTEM}

    write_stdlib_chat(path)
    assert path.stat().st_mtime_ns == written


def test_held_out_conversations_become_tasks_and_are_never_trained_on(tmp_path):
    every = stdlib_conversations()
    trained = [
        json.loads(line) for line in write_stdlib_chat(tmp_path / "chat.jsonl").read_text().splitlines()
    ]
    template = ChatTemplate(BUILTIN_TEMPLATE, "built-in", "", "<|endoftext|>")
    path = write_stdlib_tasks(
        tmp_path / "tasks.jsonl", lambda messages: template.render(messages, add_generation_prompt=True)
    )
    tasks = [json.loads(line) for line in path.read_text().splitlines()]

    assert len(tasks) == len(every) // HELD_OUT_EVERY and len(trained) + len(tasks) == len(every)
    held = every[HELD_OUT_EVERY - 1]
    assert held not in trained and every[0] in trained
    question = held["messages"][-2]["content"]
    # The built-in template (trainer/data/chat_template.py): the question's turn, then an opened assistant turn.
    assert tasks[0]["prompt"].endswith(f"<|user|>\n{question}\n<|assistant|>\n")
    assert tasks[0]["reference"] == held["messages"][-1]["content"]
    trained_questions = {record["messages"][-2]["content"] for record in trained}
    assert not any(
        task["prompt"].split("<|user|>\n")[-1].split("\n")[0] in trained_questions for task in tasks
    )
