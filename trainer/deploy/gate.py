"""The continuous-delivery gate: does a new version's evaluation beat the live one's by the suite's margin?

The suite's `deploy: {metric, margin}` (trainer/evaluation/suite.py) names one figure of one task; both versions'
evaluations under the same name (the suite's record) are read from beside their records. Lower is better for
perplexity and loss, higher for exact match. No live version: nothing to beat, the gate opens.
"""

from __future__ import annotations

from typing import Any

from trainer.evaluation.suite import DeployGate


def figure(evaluation: dict[str, Any], gate: DeployGate) -> float | None:
    """The gate's figure in one evaluation entry ({"name", "added", "results"}), or None when it lacks it."""
    kind, task, name = gate.parts
    value = ((evaluation.get("results") or {}).get(kind) or {}).get(task, {}).get(name)
    return float(value) if isinstance(value, int | float) else None


def verdict(gate: DeployGate, new: dict[str, Any], live: dict[str, Any] | None) -> tuple[bool, str]:
    """(open, why): open when the new figure beats the live one by at least the margin."""
    theirs = figure(live, gate) if live is not None else None
    ours = figure(new, gate)
    if ours is None:
        return False, f"the new version's evaluation has no {gate.metric}"
    if live is None:
        return True, f"no version is live; {gate.metric} = {ours:g}"
    if theirs is None:
        return True, f"the live version has no {gate.metric} to beat; ours = {ours:g}"
    gain = (ours - theirs) * gate.better
    way = "higher" if gate.better > 0 else "lower"
    why = f"{gate.metric}: {ours:g} vs live {theirs:g} ({way} is better; margin {gate.margin:g})"
    return gain >= gate.margin, why
