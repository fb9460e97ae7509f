"""infra/monitoring.py under the Pulumi mocks (the real inputs each stack registers), and the stall alarm's path
through moto's CloudWatch: metric data in, alarm state out, the topic the alarm names."""

from __future__ import annotations

import json

import boto3
import pytest
from moto import mock_aws

from infra.monitoring import failed_job_pattern
from tests.infra.conftest import planned
from trainer.contract import metrics as registry


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
    assert set(statement["Principal"]["Service"]) == {"cloudwatch.amazonaws.com", "events.amazonaws.com"}
    assert set(statement["Action"]) == {"kms:Decrypt", "kms:GenerateDataKey*"}
    assert "Condition" not in statement  # EventBridge's KMS calls carry no aws:SourceArn


def test_stall_alarm_counts_missing_steps_as_breaching():
    stack = planned("prod")
    stalled = alarms(stack)["training-stalled"].inputs
    queue = stack.one("batch.JobQueue", "-gpu").outputs["name"]
    assert stalled["namespace"] == registry.CLOUDWATCH_NAMESPACE == "trainstack"
    assert stalled["metricName"] == registry.STEPS.cloudwatch == "Steps"
    assert stalled["dimensions"] == {"JobQueue": queue}
    assert (stalled["statistic"], stalled["period"], stalled["evaluationPeriods"]) == ("Sum", 60, 15)
    assert (stalled["comparisonOperator"], stalled["threshold"]) == ("LessThanThreshold", 1)
    assert stalled["treatMissingData"] == "breaching"


def test_prod_pages_on_low_mfu_and_dev_has_no_floor():
    mfu = alarms(planned("prod"))["mfu-ratio-low"].inputs
    assert (mfu["metricName"], mfu["threshold"], mfu["evaluationPeriods"]) == ("MFU", 0.25, 30)
    assert set(alarms(planned("dev"))) == {"training-stalled", "fsx-nearly-full"}


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
    assert pattern == json.loads(failed_job_pattern(queue_arn))
    assert pattern["detail"] == {"status": ["FAILED"], "jobQueue": [queue_arn]}
    target = stack.one("cloudwatch.EventTarget", "-job-failed")
    assert target.inputs["arn"] == stack.one("sns.Topic", "-alarms").outputs["arn"]
    topic_policy = json.loads(stack.one("sns.TopicPolicy").inputs["policy"])
    [events] = [s for s in topic_policy["Statement"] if s["Principal"] == {"Service": "events.amazonaws.com"}]
    assert events["Condition"] == {"ArnEquals": {"aws:SourceArn": rule.outputs["arn"]}}


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


@mock_aws
def test_stall_alarm_path_against_moto():
    """Put the trainer's Steps, create the alarm as the stack does, drive its state; the alarm names the topic.

    moto 5.2.5 stores alarms and metric data but does not evaluate alarms (moto/cloudwatch/models.py: an alarm's
    state changes only in Alarm.update_state, which only set_alarm_state calls), so the
    state transition is driven with set_alarm_state, the API AWS documents for testing alarm actions; moto has no
    describe_alarm_history either. That AWS evaluates the alarm and delivers to the topic only a real account shows."""
    stack = planned("dev")
    inputs = alarms(stack)["training-stalled"].inputs
    cloudwatch = boto3.client("cloudwatch", region_name="us-east-1")
    sns = boto3.client("sns", region_name="us-east-1")
    topic = sns.create_topic(Name="alarms")["TopicArn"]
    cloudwatch.put_metric_data(
        Namespace=inputs["namespace"],
        MetricData=[
            {
                "MetricName": inputs["metricName"],
                "Dimensions": [{"Name": "JobQueue", "Value": "q"}],
                "Value": 3,
            }
        ],
    )
    cloudwatch.put_metric_alarm(
        AlarmName="stalled",
        Namespace=inputs["namespace"],
        MetricName=inputs["metricName"],
        Dimensions=[{"Name": "JobQueue", "Value": "q"}],
        Statistic=inputs["statistic"],
        Period=int(inputs["period"]),
        EvaluationPeriods=int(inputs["evaluationPeriods"]),
        Threshold=inputs["threshold"],
        ComparisonOperator=inputs["comparisonOperator"],
        TreatMissingData=inputs["treatMissingData"],
        AlarmActions=[topic],
    )
    listed = cloudwatch.list_metrics(Namespace="trainstack")["Metrics"]
    assert [(m["MetricName"], m["Dimensions"]) for m in listed] == [
        ("Steps", [{"Name": "JobQueue", "Value": "q"}])
    ]
    cloudwatch.set_alarm_state(AlarmName="stalled", StateValue="ALARM", StateReason="no step for 15 minutes")
    [alarm] = cloudwatch.describe_alarms(AlarmNames=["stalled"])["MetricAlarms"]
    assert (alarm["StateValue"], alarm["AlarmActions"], alarm["TreatMissingData"]) == (
        "ALARM",
        [topic],
        "breaching",
    )
