"""The suite file's checks and the arithmetic of its figures, by hand."""

import math

import pytest

from trainer.evaluation.suite import (
    SuiteError,
    exact_match,
    mean_interval,
    normalise,
    read_suite,
    wilson_interval,
)


def test_wilson_interval_of_seven_in_ten_is_the_hand_computed_one():
    # n = 10, p = 0.7, z^2 = 3.841459: centre (0.7 + 0.192073) / 1.384146 = 0.644493,
    # half 1.959964 / 1.384146 * sqrt(0.021 + 0.0096036) = 0.247715
    low, high = wilson_interval(7, 10)
    assert low == pytest.approx(0.396778, abs=2e-6) and high == pytest.approx(0.892209, abs=2e-6)


def test_wilson_interval_is_not_empty_at_none_or_all():
    low, high = wilson_interval(0, 5)
    assert low == 0.0 and high == pytest.approx(3.841459 / (5 + 3.841459), rel=1e-6)  # z^2 / (n + z^2)
    low, high = wilson_interval(5, 5)
    assert high == 1.0 and low == pytest.approx(5 / (5 + 3.841459), rel=1e-6)
    with pytest.raises(ValueError, match="6 successes in 5 trials"):
        wilson_interval(6, 5)


def test_mean_interval_by_hand():
    # mean 2, sample standard deviation 1 (values 1, 2, 3), n = 3: 2 +- 1.959964 / sqrt(3)
    low, high = mean_interval([1.0, 2.0, 3.0])
    assert (low, high) == (pytest.approx(2 - 1.131586, abs=1e-6), pytest.approx(2 + 1.131586, abs=1e-6))
    assert mean_interval([4.0]) == (-math.inf, math.inf)


@pytest.mark.parametrize(
    ("prediction", "reference", "same"),
    [
        ("  Hello\tWorld \n", "hello world", True),
        ("ﬁve", "five", True),  # NFKC folds the ligature
        ("STRASSE", "straße", True),  # casefold, not lower
        ("x = 1", "x=1", False),  # spacing inside the answer counts
        ("42.", "42", False),  # punctuation counts
    ],
)
def test_exact_match_normalisation(prediction, reference, same):
    assert exact_match(prediction, reference) is same
    assert normalise(prediction) == normalise(normalise(prediction))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{}", "the suite names no task"),
        (
            "perplexity:\n  - {name: a, data: PREFIX, samples: 0}\n",
            "perplexity.0.samples: Input should be greater than 0 (got 0)",
        ),
        ("perplexity:\n  - {name: a, data: PREFIX, sample: 3}\n", "perplexity.0.sample: unknown key"),
        (
            "perplexity:\n  - {name: a, data: nowhere}\n",
            "perplexity.0.data = 'nowhere': no nowhere.bin / .idx",
        ),
        (
            "generation:\n  - {name: a, file: missing.jsonl}\n",
            "generation.0.file = 'missing.jsonl': no such file",
        ),
        ("generation:\n  - {name: 'a b', file: TASKS}\n", "generation.0.name: String should match pattern"),
        (
            "perplexity:\n  - {name: a, data: PREFIX}\ngeneration:\n  - {name: a, file: TASKS}\n",
            "task names must differ; repeated: a",
        ),
        ("generation: [", "not YAML"),
    ],
)
def test_bad_suites_are_refused_with_the_key(text, message, tmp_path, tiny_corpus):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"prompt": "1 + 1 =", "reference": "2"}\n')
    suite = tmp_path / "suite.yaml"
    suite.write_text(text.replace("PREFIX", tiny_corpus).replace("TASKS", str(tasks)))
    with pytest.raises(SuiteError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        read_suite(suite)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"prompt": "a"}', 'line 1: give an object with string "prompt" and "reference"'),
        ("[1, 2]", 'line 1: give an object with string "prompt" and "reference"'),
        ("{oops", "line 1: not JSON"),
        ("", "holds no examples"),
    ],
)
def test_bad_task_files_are_refused_with_the_line(line, message, tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(line + "\n")
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"generation:\n  - {{name: t, file: {tasks}}}\n")
    with pytest.raises(SuiteError, match=message.replace("[", r"\[")):
        read_suite(suite)
