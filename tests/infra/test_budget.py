"""The stack's AWS Budgets budget (infra/budget.py) under the Pulumi mocks: its limit, its cost-allocation tag
filter and its notifications to the alarm topic, which Budgets may publish to and encrypt for."""

from __future__ import annotations

import json

import pytest

from infra.budget import tag_filter
from infra.mocks import ACCOUNT_ID
from tests.infra.conftest import planned


@pytest.mark.parametrize(
    ("name", "limit"), [("dev", "2000.00"), ("staging", "20000.00"), ("prod", "250000.00")]
)
def test_each_stack_budgets_its_tagged_monthly_cost(name, limit):
    stack = planned(name)
    budget = stack.one("budgets.Budget").inputs
    assert (budget["budgetType"], budget["limitAmount"], budget["limitUnit"], budget["timeUnit"]) == (
        "COST",
        limit,
        "USD",
        "MONTHLY",
    )
    # The same tag the provider puts on every resource (its default tags), in Budgets' TagKeyValue form.
    [provider] = [r for r in stack.plan.resources if r.type == "pulumi:providers:aws"]
    default_tags = json.loads(provider.inputs["defaultTags"])["tags"]
    assert budget["costFilters"] == [
        {"name": "TagKeyValue", "values": [f"user:stack${default_tags['stack']}"]}
    ]


def test_budget_notifies_the_alarm_topic_at_80_and_100_percent_and_on_forecast():
    stack = planned("prod")
    topic = stack.one("sns.Topic", "-alarms").outputs["arn"]
    notifications = stack.one("budgets.Budget").inputs["notifications"]
    assert [(n["notificationType"], n["threshold"]) for n in notifications] == [
        ("ACTUAL", 80),
        ("ACTUAL", 100),
        ("FORECASTED", 100),
    ]
    assert all(n["subscriberSnsTopicArns"] == [topic] for n in notifications)
    assert all(n["comparisonOperator"] == "GREATER_THAN" for n in notifications)


def test_topic_policy_lets_this_accounts_budgets_publish():
    policy = json.loads(planned("prod").one("sns.TopicPolicy").inputs["policy"])
    [statement] = [s for s in policy["Statement"] if s["Sid"] == "AccountBudgetsPublish"]
    assert statement["Principal"] == {"Service": "budgets.amazonaws.com"}
    assert statement["Action"] == "sns:Publish"
    assert statement["Condition"] == {
        "StringEquals": {"aws:SourceAccount": ACCOUNT_ID},
        "ArnLike": {"aws:SourceArn": f"arn:aws:budgets::{ACCOUNT_ID}:*"},
    }


def test_a_budget_limit_must_be_positive(variant):
    with pytest.raises(Exception, match="trainstack:monthlyBudgetUsd = 0"):
        variant("dev", **{"trainstack:monthlyBudgetUsd": 0})


def test_tag_filter_joins_key_and_value_as_budgets_expects():
    assert tag_filter("business-unit", "human_resources") == "user:business-unit$human_resources"


def test_dashboard_has_a_cost_row_from_the_runs_ledgers():
    body = json.loads(planned("prod").one("cloudwatch.Dashboard").inputs["dashboardBody"])
    [cost] = [w for w in body["widgets"] if w["properties"]["title"].startswith("Cost per run")]
    [goodput] = [w for w in body["widgets"] if w["properties"]["title"].startswith("Goodput per run")]
    text = json.dumps([cost, goodput])
    for name in ("CostDollars", "CostPerMillionTokens", "Goodput"):
        assert f'MetricName=\\"{name}\\"' in text
