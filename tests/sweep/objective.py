"""A fast objective in the trainer's place (tests/sweep/test_study.py): reads the trial's `key=value` overrides,
writes metrics.jsonl as the trainer does (a validation loss every 10 steps, with a pause between), and exits 0.

Its validation loss at step s falls as 1/s towards a floor set by how far log10(optimizer.lr) is from -2.5, so a
trial's early values already rank it. optimizer.lr above `crash_above` (another override) makes it exit 3 after
step 10, as a crashing trainer would. `dollars_per_trial` (another override) makes it write, as it starts, a
ledger.json that spent that much, as the trainer's rank 0 does in its run directory (trainer/cost/ledger.py).
At its end it writes heldout-losses.json: 64 windows' losses around its last validation loss, varying by window
and by `seed` as a trained model's would (by `seed_spread` x sin(seed), 0.02 unless given) (read by conftest.objective_evaluate in the held-out scorer's place).
`fade_lr=X` makes the trial whose optimizer.lr is X fall 2 nats behind at its last evaluation (ahead until then).
`linger=S` keeps it running S seconds after its last line, as the trainer does while it saves its last checkpoint.
`stop_at=N` stops it at step N as the trainer's dollar cap does (trainer/loop.py): that step's line, the
trainer's "saved and stopped" message, exit 0. `nan_at=N` makes the validation loss NaN from step N on."""

import json
import math
import sys
import time
from pathlib import Path

settings = dict(arg.split("=", 1) for arg in sys.argv[1:])
run_dir = Path(settings["logging.run_dir"])
run_dir.mkdir(parents=True, exist_ok=True)
lr = float(settings["optimizer.lr"])
iters = int(settings.get("schedule.train_iters", 60))
if "dollars_per_trial" in settings:
    print(f"objective: budget.max_dollars={settings.get('budget.max_dollars')}", flush=True)
    (run_dir / "ledger.json.tmp").write_text(json.dumps({"dollars": float(settings["dollars_per_trial"])}))
    (run_dir / "ledger.json.tmp").rename(run_dir / "ledger.json")
floor = 5.0 + (math.log10(lr) + 2.5) ** 2
stop_at = int(settings.get("stop_at", iters + 1))
nan_at = int(settings.get("nan_at", iters + 1))
fades = lr == float(settings.get("fade_lr", "nan"))
CAPPED = "step {}: budget.max_dollars = 1 reached: spent $1.00; saved and stopped. to go on, resume with more"


def capped(step: int) -> None:
    print(CAPPED.format(step), file=sys.stderr, flush=True)
    sys.exit(0)


with (run_dir / "metrics.jsonl").open("a") as metrics:
    for step in range(0, iters + 1, 10):
        if step > stop_at:  # the cap reached between evaluations: that step's line, with no validation loss
            metrics.write(json.dumps({"step": stop_at, "loss": floor + 20 / stop_at}) + "\n")
            metrics.flush()
            capped(stop_at)
        record = {
            "step": step,
            "loss": None if step == 0 else floor + 20 / step,
            "val_loss": float("nan")
            if step >= nan_at
            else floor + 20 / (step + 1) + (2.0 if step == iters and fades else 0),
        }
        metrics.write(json.dumps(record) + "\n")
        metrics.flush()
        if step == stop_at:
            capped(step)
        if step == 10 and lr > float(settings.get("crash_above", "inf")):
            print("objective: crashed on purpose", flush=True)
            sys.exit(3)
        time.sleep(0.05)
time.sleep(float(settings.get("linger", 0)))
seed = int(settings.get("seed", 7))
final = floor + 20 / (iters + 1) + float(settings.get("seed_spread", 0.02)) * math.sin(seed)
windows = [final + 0.5 * math.sin(1.7 * i) + 0.01 * math.cos(seed * i) for i in range(64)]
(run_dir / "heldout-losses.json").write_text(json.dumps(windows))
print("objective: done", flush=True)
