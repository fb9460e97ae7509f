"""trainstack's CrossGuard policy pack: the guardrails every stack must pass (see docs/policy.md).

`pulumi preview|up --policy-pack policy` runs it for real (`policy/__main__.py` serves the pack);
`make policy STACK=<env>` runs the same policies over the offline preview (`policy/offline.py`).
"""
