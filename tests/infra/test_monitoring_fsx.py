"""The FSx nearly-full alarm and the free-capacity widget read the file system's free bytes.

FSx for Lustre User Guide, "Amazon FSx for Lustre metrics and dimensions": FreeDataStorageCapacity comes as one point
per disk (OST) per minute; the file system's free bytes are their Sum per minute. The moto test puts data shaped that
way into CloudWatch and reads it back with the alarm's own statistic and period."""

from __future__ import annotations

import datetime
import json

import boto3
import pytest
from moto import mock_aws

from tests.infra.conftest import planned

GIB = 2**30


def fsx_alarm(stack):
    [alarm] = [a for a in stack.all("cloudwatch.MetricAlarm") if a.name.endswith("-fsx-nearly-full")]
    return alarm.inputs


@pytest.mark.parametrize("name", ["dev", "staging", "prod"])
def test_alarm_and_widget_sum_free_capacity_over_one_minute(name):
    stack = planned(name)
    assert (fsx_alarm(stack)["statistic"], fsx_alarm(stack)["period"]) == ("Sum", 60)
    body = json.loads(stack.one("cloudwatch.Dashboard").inputs["dashboardBody"])
    [widget] = [w for w in body["widgets"] if w["properties"]["title"].startswith("FSx free capacity")]
    assert widget["properties"]["period"] == 60
    assert widget["properties"]["metrics"][0][-1] == {"stat": "Sum"}


@mock_aws
def test_the_alarms_statistic_reads_the_file_systems_free_bytes():
    """Four disks with 100 GiB free each, reported every minute for five minutes: 400 GiB free."""
    stack = planned("prod")
    alarm = fsx_alarm(stack)
    cloudwatch = boto3.client("cloudwatch", region_name="us-east-1")
    start = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC)
    for minute in range(5):
        cloudwatch.put_metric_data(
            Namespace=alarm["namespace"],
            MetricData=[
                {
                    "MetricName": alarm["metricName"],
                    "Dimensions": [{"Name": "FileSystemId", "Value": "fs-0123"}],
                    "Timestamp": start + datetime.timedelta(minutes=minute, seconds=disk),
                    "Value": 100.0 * GIB,
                    "Unit": "Bytes",
                }
                for disk in range(4)
            ],
        )

    def summed(period: int) -> list[float]:
        points = cloudwatch.get_metric_statistics(
            Namespace=alarm["namespace"],
            MetricName=alarm["metricName"],
            Dimensions=[{"Name": "FileSystemId", "Value": "fs-0123"}],
            StartTime=start,
            EndTime=start + datetime.timedelta(minutes=5),
            Period=int(period),
            Statistics=[alarm["statistic"]],
        )["Datapoints"]
        return sorted(p["Sum"] for p in points)

    assert summed(alarm["period"]) == [400.0 * GIB] * 5
    assert summed(300) == [2000.0 * GIB]  # what the 300 s alarm read: five times the free space
