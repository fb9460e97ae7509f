"""`python -m trainer sweep` as a real process, its trials run by tests/sweep/objective.py in the trainer's place
(fast), their held-out scores the windows it writes (conftest.objective_evaluate): `python -m tests.sweep.driver [objective settings --] <sweep arguments>`, from the repository's root."""

import argparse
import functools
import signal
import sys

from tests.sweep.conftest import objective_command, objective_evaluate
from trainer.sweep import command

# Ctrl-C as a terminal's foreground job gets it: Python's KeyboardInterrupt. An ignored signal is inherited across
# exec (signal(7)), and a shell without job control starts a background command with SIGINT ignored (POSIX Shell
# Command Language, 2.11 "Signals and Error Handling"): in a clean-clone run started as `nohup ... &` from a script,
# this driver (a descendant) ran its trial to the end after SIGINT, and test_driver.py's `int` case failed.
inherited = signal.getsignal(signal.SIGINT)
if inherited is not signal.default_int_handler or signal.SIGINT in signal.pthread_sigmask(
    signal.SIG_BLOCK, []
):
    print(f"tests/sweep/driver.py: SIGINT inherited as {inherited}; reset", file=sys.stderr)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
command.heldout_evaluator = lambda *_: objective_evaluate
arguments = sys.argv[1:]
settings = arguments[: arguments.index("--")] if "--" in arguments else []
arguments = arguments[len(settings) + 1 :] if settings else arguments
command.run_sweep = functools.partial(command.run_sweep, command=objective_command(*settings))
parser = argparse.ArgumentParser()
command.add_arguments(parser)
sys.exit(command.main(parser.parse_args(arguments)))
