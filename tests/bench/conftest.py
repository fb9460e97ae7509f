"""The bench tests run the suites' real code on the trainer tests' tiny corpus and model."""

from ..trainer.conftest import tiny_config, tiny_corpus  # noqa: F401  (fixtures)
