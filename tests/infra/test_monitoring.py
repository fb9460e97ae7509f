"""infra/monitoring.py under the Pulumi mocks (the real inputs each stack registers), and the stall alarm's path
through moto's CloudWatch: metric data in, alarm state out, the topic the alarm names."""

from __future__ import annotations

import io
import json
import re
import time
from datetime import UTC, datetime, timedelta

import boto3
import pytest
from moto import mock_aws

from infra.monitoring import failed_job_pattern
from tests.infra.conftest import planned
from tests.monitoring.fixtures import emf_to_cloudwatch
from trainer.contract import metrics as registry
from trainer.monitoring.cloudwatch import EmfWriter
from trainer.monitoring.exporters import Monitor


def alarms(stack):
    """The training alarms of infra/monitoring.py (the audit trail's alarms are tests/infra/test_audit.py's)."""
    return {
        r.name.removeprefix(f"trainstack-{stack.stack}-"): r
        for r in stack.all("cloudwatch.MetricAlarm")
        if r.parent == "monitoring"
    }


@pytest.mark.parametrize("name", ["dev", "staging", "prod"])
def test_every_alarm_notifies_the_stack_topic(name):
    stack = planned(name)
    topic = stack.one("sns.Topic", "-alarms")
    for alarm in stack.all("cloudwatch.MetricAlarm"):
        assert alarm.inputs["alarmActions"] == [topic.outputs["arn"]], alarm.name
        assert alarm.inputs["okActions"] == [topic.outputs["arn"]], alarm.name


@pytest.mark.parametrize("name", ["dev", "staging", "prod"])
def test_topic_is_encrypted_with_the_stack_key(name):
    stack = planned(name)
    assert stack.one("sns.Topic", "-alarms").inputs["kmsMasterKeyId"] == stack.key_arn


def test_key_policy_lets_alarms_and_eventbridge_encrypt_for_the_topic():
    stack = planned("prod")
    policy = json.loads(stack.one("kms.Key").inputs["policy"])
    [statement] = [s for s in policy["Statement"] if s["Sid"] == "AlarmsAndEventsPublishToEncryptedTopic"]
    assert set(statement["Principal"]["Service"]) == {
        "cloudwatch.amazonaws.com",
        "events.amazonaws.com",
        "budgets.amazonaws.com",  # the stack budget's notifications (tests/infra/test_budget.py)
    }
    assert set(statement["Action"]) == {"kms:Decrypt", "kms:GenerateDataKey*"}
    assert "Condition" not in statement  # EventBridge's KMS calls carry no aws:SourceArn


@pytest.mark.parametrize(("name", "queues"), [("prod", ["gpu"]), ("dev", ["gpu", "spot"])])
def test_every_queue_has_a_stall_alarm_on_its_jobs_largest_step_age(name, queues):
    stack = planned(name)
    by_name = alarms(stack)
    for key in queues:
        stalled = by_name["training-stalled" if key == "gpu" else f"{key}-training-stalled"].inputs
        queue = stack.one("batch.JobQueue", f"-{key}").outputs["name"]
        assert stalled["namespace"] == registry.CLOUDWATCH_NAMESPACE == "trainstack"
        assert stalled["metricName"] == registry.SECONDS_SINCE_LAST_STEP.cloudwatch == "SecondsSinceLastStep"
        assert stalled["dimensions"] == {"JobQueue": queue}
        assert (stalled["statistic"], stalled["period"], stalled["threshold"]) == ("Maximum", 60, 15 * 60)
        assert (stalled["evaluationPeriods"], stalled["datapointsToAlarm"]) == (3, 1)
        assert stalled["comparisonOperator"] == "GreaterThanThreshold"
        assert stalled["treatMissingData"] == "notBreaching"  # an idle queue, or a clean end, is quiet


def test_prod_pages_on_low_mfu_and_dev_has_no_floor():
    mfu = alarms(planned("prod"))["mfu-ratio-low"].inputs
    assert (mfu["metricName"], mfu["threshold"], mfu["evaluationPeriods"]) == ("MFU", 0.25, 30)
    assert set(alarms(planned("dev"))) == {"training-stalled", "spot-training-stalled", "fsx-nearly-full"}


def test_fsx_alarm_is_ten_percent_of_the_file_system():
    stack = planned("prod")
    fsx = alarms(stack)["fsx-nearly-full"].inputs
    assert (fsx["namespace"], fsx["metricName"], fsx["statistic"]) == (
        "AWS/FSx",
        "FreeDataStorageCapacity",
        "Sum",
    )
    assert fsx["dimensions"] == {"FileSystemId": stack.one("fsx.LustreFileSystem").id}
    assert fsx["threshold"] == 4800 * 2**30 * 0.10


def test_failed_jobs_of_the_queue_go_to_the_topic():
    stack = planned("prod")
    rule = stack.one("cloudwatch.EventRule", "-job-failed")
    pattern = json.loads(rule.inputs["eventPattern"])
    queue_arn = stack.one("batch.JobQueue", "-gpu").outputs["arn"]
    assert pattern == json.loads(failed_job_pattern([queue_arn]))
    assert pattern["detail"] == {"status": ["FAILED"], "jobQueue": [queue_arn]}
    target = stack.one("cloudwatch.EventTarget", "-job-failed")
    assert target.inputs["arn"] == stack.one("sns.Topic", "-alarms").outputs["arn"]
    topic_policy = json.loads(stack.one("sns.TopicPolicy").inputs["policy"])
    [events] = [s for s in topic_policy["Statement"] if s["Principal"] == {"Service": "events.amazonaws.com"}]
    assert events["Condition"] == {"ArnEquals": {"aws:SourceArn": rule.outputs["arn"]}}


def test_dev_reports_failed_jobs_of_its_spot_queue_too():
    stack = planned("dev")
    pattern = json.loads(stack.one("cloudwatch.EventRule", "-job-failed").inputs["eventPattern"])
    arns = [stack.one("batch.JobQueue", f"-{key}").outputs["arn"] for key in ("gpu", "spot")]
    assert pattern["detail"]["jobQueue"] == arns


def test_subscribers_come_from_the_stack_config(variant):
    # As the Pulumi CLI hands a list to the program: JSON text.
    stack = variant("dev", **{"trainstack:alarmEmails": '["a@example.com", "b@example.com"]'})
    subscriptions = stack.all("sns.TopicSubscription")
    assert sorted((s.inputs["protocol"], s.inputs["endpoint"]) for s in subscriptions) == [
        ("email", "a@example.com"),
        ("email", "b@example.com"),
    ]


def test_dashboard_shows_the_run_the_nodes_and_fsx():
    stack = planned("prod")
    body = json.loads(stack.one("cloudwatch.Dashboard").inputs["dashboardBody"])
    titles = [w["properties"]["title"] for w in body["widgets"]]
    assert titles[:4] == ["Loss", "Tokens/s", "MFU", "Step time per rank (s)"]
    assert (
        any("GPU" in t for t in titles)
        and any("EFA" in t for t in titles)
        and any("FSx" in t for t in titles)
    )
    text = json.dumps(body)
    assert 'JobQueue=\\"trainstack-prod-gpu\\"' in text and "{trainstack,JobQueue,Run,Rank}" in text


def test_dev_dashboard_shows_each_queues_runs_step_age():
    body = json.loads(planned("dev").one("cloudwatch.Dashboard").inputs["dashboardBody"])
    [progress] = [
        w for w in body["widgets"] if w["properties"]["title"].startswith("Seconds since the last step")
    ]
    expressions = [line[0]["expression"] for line in progress["properties"]["metrics"]]
    assert [re.search(r'JobQueue="([^"]+)"', e).group(1) for e in expressions] == [
        "trainstack-dev-gpu",
        "trainstack-dev-spot",
    ]
    assert all('MetricName="SecondsSinceLastStep"' in e and "'Maximum'" in e for e in expressions)


@mock_aws
def test_one_stalled_job_among_healthy_ones_raises_the_queue_alarms_statistic():
    """Three runs on one queue write their heartbeat as EMF (the trainer's own writer); CloudWatch's extraction of
    those lines is replayed into moto; the alarm's statistic over the queue is the stalled run's step age.

    moto 5.2.5 stores alarms and metric data but does not evaluate alarms (moto/cloudwatch/models.py: an alarm's
    state changes only in Alarm.update_state, which only set_alarm_state calls), so the state transition is driven
    with set_alarm_state, the API AWS documents for testing alarm actions. That AWS evaluates the alarm and
    delivers to the topic only a real account shows."""
    stack = planned("dev")
    inputs = alarms(stack)["spot-training-stalled"].inputs
    out = io.StringIO()
    for run, minutes_since_step in (("a", 0.5), ("b", 40), ("c", 1)):
        dimensions = {"JobQueue": "q", "Run": run, "Rank": "0", "Node": "n"}
        watch = Monitor({"run": run, "rank": "0"}, cloudwatch=EmfWriter(dimensions, interval_s=0, stream=out))
        watch.last_step = time.time() - minutes_since_step * 60
        watch.heartbeat()
    cloudwatch = boto3.client("cloudwatch", region_name="us-east-1")
    emf_to_cloudwatch(cloudwatch, out.getvalue().splitlines())
    [datapoint] = cloudwatch.get_metric_statistics(
        Namespace=inputs["namespace"],
        MetricName=inputs["metricName"],
        Dimensions=[{"Name": "JobQueue", "Value": "q"}],
        StartTime=datetime.now(UTC) - timedelta(minutes=5),
        EndTime=datetime.now(UTC) + timedelta(minutes=5),
        Period=600,
        Statistics=[inputs["statistic"]],
    )["Datapoints"]
    assert (
        datapoint["Maximum"] == pytest.approx(40 * 60, abs=5) and datapoint["Maximum"] > inputs["threshold"]
    )

    sns = boto3.client("sns", region_name="us-east-1")
    topic = sns.create_topic(Name="alarms")["TopicArn"]
    cloudwatch.put_metric_alarm(
        AlarmName="stalled",
        Namespace=inputs["namespace"],
        MetricName=inputs["metricName"],
        Dimensions=[{"Name": "JobQueue", "Value": "q"}],
        Statistic=inputs["statistic"],
        Period=int(inputs["period"]),
        EvaluationPeriods=int(inputs["evaluationPeriods"]),
        DatapointsToAlarm=int(inputs["datapointsToAlarm"]),
        Threshold=inputs["threshold"],
        ComparisonOperator=inputs["comparisonOperator"],
        TreatMissingData=inputs["treatMissingData"],
        AlarmActions=[topic],
    )
    cloudwatch.set_alarm_state(
        AlarmName="stalled", StateValue="ALARM", StateReason="run b: no step for 40 min"
    )
    [alarm] = cloudwatch.describe_alarms(AlarmNames=["stalled"])["MetricAlarms"]
    assert (alarm["StateValue"], alarm["AlarmActions"], alarm["DatapointsToAlarm"]) == ("ALARM", [topic], 1)
