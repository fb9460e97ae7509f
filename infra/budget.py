"""The stack's AWS Budgets budget: the month's cost of every resource carrying the stack's cost-allocation tag,
with notifications to the stack's alarm topic (infra/monitoring.py), whose policy lets Budgets publish and whose
KMS key lets it encrypt (infra/keys.py TOPIC_PUBLISHERS).

The run's own hard cap is the trainer's (budget.max_dollars, trainer/cost/ledger.py); this budget watches the
whole stack (idle FSx, NAT, storage too), and only warns: Budgets actions that stop resources are not used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pulumi
import pulumi_aws as aws

from infra.config import StackConfig

if TYPE_CHECKING:
    from infra.monitoring import Monitoring

# The cost-allocation tag the budget filters on, from the provider's default tags (StackConfig.tags).
COST_ALLOCATION_TAG = "stack"
# (kind, percent of the monthly limit) that notify: spent 80 % and 100 %, and a forecast past 100 %.
NOTIFICATIONS = (("ACTUAL", 80), ("ACTUAL", 100), ("FORECASTED", 100))


def tag_filter(key: str, value: str) -> str:
    """A TagKeyValue cost filter value: user-defined tags carry the `user:` prefix, key and value joined by `$`
    (pulumi-aws 7.51.1 budgets/budget.py example: "user:business-unit$human_resources")."""
    return f"user:{key}${value}"


@dataclass
class BudgetArgs:
    config: StackConfig
    monitoring: Monitoring


class Budget(pulumi.ComponentResource):
    def __init__(self, name: str, args: BudgetArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainstack:budget:Budget", name, None, opts)
        cfg, child = args.config, pulumi.ResourceOptions(parent=self)
        self.budget = None
        if cfg.monthly_budget_usd is not None:
            self.budget = aws.budgets.Budget(
                f"{cfg.name_prefix}-monthly-cost",
                name=f"{cfg.name_prefix}-monthly-cost",
                budget_type="COST",
                limit_amount=f"{cfg.monthly_budget_usd:.2f}",
                limit_unit="USD",
                time_unit="MONTHLY",
                cost_filters=[
                    {
                        "name": "TagKeyValue",
                        "values": [tag_filter(COST_ALLOCATION_TAG, cfg.tags[COST_ALLOCATION_TAG])],
                    }
                ],
                notifications=[
                    {
                        "comparison_operator": "GREATER_THAN",
                        "threshold": percent,
                        "threshold_type": "PERCENTAGE",
                        "notification_type": kind,
                        "subscriber_sns_topic_arns": [args.monitoring.topic.arn],
                    }
                    for kind, percent in NOTIFICATIONS
                ],
                opts=child,
            )
        self.register_outputs({})
