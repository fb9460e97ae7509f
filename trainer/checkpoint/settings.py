"""The schedule and data settings a checkpoint was trained under, and how a resuming config differs from them.

megatron's LR scheduler, left to its defaults, keeps the checkpoint's LR, warmup and decay on resume
(use_checkpoint_opt_param_scheduler, megatron-core 0.16.1 optimizer_param_scheduler.py _check_and_set), and the
training dataset is sized and shuffled from train_iters x global_batch_size (GPTDataset num_samples,
trainer/data/loader.py): an edited config would be ignored in part and reshuffle the sample stream in part. So a
resume compares these settings and refuses a change unless checkpoint.allow_schedule_change is set; then the
config's values take effect (trainer/distributed/optimizer.py builds the scheduler to override the checkpoint's).
"""

from __future__ import annotations

from trainer.config import TrainConfig

KEY = "run_settings"  # where each format's saved state holds them
ALLOW = "checkpoint.allow_schedule_change"


def run_settings(cfg: TrainConfig) -> dict:
    """What decides the LR schedule and the training sample stream, by config key."""
    s, o, d = cfg.schedule, cfg.optimizer, cfg.data
    return {
        "optimizer.lr": o.lr,
        "optimizer.min_lr": o.min_lr,
        "optimizer.weight_decay": o.weight_decay,
        "schedule.lr_warmup_iters": s.lr_warmup_iters,
        "schedule.lr_decay_style": s.lr_decay_style,
        "schedule.lr_decay_iters": s.lr_decay_iters or s.train_iters,  # as the scheduler resolves it
        "schedule.train_iters": s.train_iters,
        "schedule.global_batch_size": s.global_batch_size,
        "data.seq_length": d.seq_length,
        "data.prefixes": list(d.prefixes),
        "data.weights": list(d.weights) if d.weights is not None else None,
        "data.split": d.split,
        "seed": cfg.seed,
    }


def setting_changes(saved: dict, cfg: TrainConfig) -> list[str]:
    """Each setting whose config value differs from the checkpoint's: 'key = config value in the config, saved
    value in the checkpoint'. A key the checkpoint did not record is not compared."""
    ours = run_settings(cfg)
    return [
        f"{key} = {ours[key]!r} in the config, {saved[key]!r} in the checkpoint"
        for key in ours
        if key in saved and saved[key] != ours[key]
    ]
