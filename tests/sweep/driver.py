"""`python -m trainer sweep` as a real process, its trials run by tests/sweep/objective.py in the trainer's place
(fast), their held-out scores the windows it writes (conftest.objective_evaluate): `python -m tests.sweep.driver [objective settings --] <sweep arguments>`, from the repository's root."""

import argparse
import functools
import sys

from tests.sweep.conftest import objective_command, objective_evaluate
from trainer.sweep import command

command.heldout_evaluator = lambda *_: objective_evaluate
arguments = sys.argv[1:]
settings = arguments[: arguments.index("--")] if "--" in arguments else []
arguments = arguments[len(settings) + 1 :] if settings else arguments
command.run_sweep = functools.partial(command.run_sweep, command=objective_command(*settings))
parser = argparse.ArgumentParser()
command.add_arguments(parser)
sys.exit(command.main(parser.parse_args(arguments)))
