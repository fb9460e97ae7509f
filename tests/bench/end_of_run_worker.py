"""One process of the end-of-run memory test, launched by torchrun: the trainer's whole loop (trainer/loop.py)
with background saves every 2 steps and an evaluation at the last step, every allocation traced; writes the
peak of each training step and of the final evaluation.

    end_of_run_worker.py CONFIG OUT --set key=value ...      OUT/peaks.json
"""

import argparse
import json
from pathlib import Path

from rich.console import Console

from trainer import engines, loop
from trainer.bench.allocations import AllocationTrace
from trainer.config import load_config
from trainer.device import device_type
from trainer.distributed import parallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("out", type=Path)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    cfg = load_config(args.config, args.overrides)
    dims = parallel.initialize(cfg)
    build = engines.build
    try:
        with AllocationTrace(device_type()) as trace:

            def traced_build(cfg, dims):
                run = build(cfg, dims)
                step, evaluate = run.train_step, run.evaluate

                def traced_step(*a, **k):
                    with trace.phase("step"):
                        return step(*a, **k)

                def traced_evaluate():
                    with trace.phase("evaluate"):
                        return evaluate()

                run.train_step, run.evaluate = traced_step, traced_evaluate
                return run

            engines.build = loop.engines.build = traced_build
            loop.train(cfg, dims, Console(quiet=True), fresh=True)
        peaks = {
            "steps": [trace.peak_during(p) for p in trace.phases("step")],
            "evaluations": [trace.peak_during(p) for p in trace.phases("evaluate")],
        }
        (args.out / "peaks.json").write_text(json.dumps(peaks))
    finally:
        engines.build = build
        parallel.shutdown()


if __name__ == "__main__":
    main()
