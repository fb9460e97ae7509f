"""Hyperparameter sweeps (`make sweep`): an Optuna study over a search space declared beside the recipe, each trial
a real trainer run, pruned on the validation loss it logs. Above config, models, cost and tracking; below jobs.

    space     the sweep YAML: recipe, trials, sampler, pruner, the shared trial shape, the search space; all checked
    trial     one trial: `python -m trainer train` in its own session, metrics.jsonl read as it grows, pruned or not
    study     the study in its journal file under runs/sweeps/<name>/: resume, TPE, the pruner, the trial loop;
              trial 0 the recipe's own values
    heldout   the one held-out set every finished trial is scored on, its standard error, paired differences
    confirm   the verdict: the best and the recipe's values on more seeds, better only beyond the seed spread
    report    the table of trials, the plots (PNG), the returned configuration's --set lines and YAML
    command   `python -m trainer sweep`
    worker    `python -m trainer sweep-worker`: one of several workers sharing the study (a stack's array job), under one dollar cap
"""
