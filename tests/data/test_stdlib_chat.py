"""The built-in chat set: conversations made from the standard library's sources, the same on every run, each
one a valid chat record with an answer to train on."""

from trainer.data.chat import read_conversations
from trainer.data.stdlib_chat import MAX_ANSWER_CHARS, SYSTEM, write_stdlib_chat


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
