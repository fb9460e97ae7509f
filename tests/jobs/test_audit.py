"""`make audit`: LookupEvents through botocore's Stubber (requests and responses checked against the CloudTrail API
model), and S3 data events from trail log files in moto's S3.

The CloudTrail records follow the documented record envelope (CloudTrail User Guide, "CloudTrail record contents":
eventVersion, userIdentity, eventTime, eventSource, eventName, awsRegion, requestParameters, responseElements,
eventID, readOnly, eventType, eventCategory), with Batch's SubmitJob/TerminateJob request fields (Batch API)."""

from __future__ import annotations

import gzip
import json
from datetime import UTC, datetime

import boto3
import pytest
from botocore.stub import ANY, Stubber
from moto import mock_aws

from trainer.aws.outputs import StackOutputs
from trainer.jobs import audit

ACCOUNT = "111122223333"
REGION = "us-east-1"
NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
SINCE = datetime(2026, 12, 3, 0, 0, tzinfo=UTC)
OUTPUTS = StackOutputs(
    "dev",
    {
        "region": REGION,
        "kms_key_arn": f"arn:aws:kms:{REGION}:{ACCOUNT}:key/1234abcd-12ab-34cd-56ef-1234567890ab",
        "datasets_bucket": "trainstack-dev-datasets",
        "checkpoints_bucket": "trainstack-dev-checkpoints",
        "audit_bucket": "trainstack-dev-audit-logs",
        "audit_trail": f"arn:aws:cloudtrail:{REGION}:{ACCOUNT}:trail/trainstack-dev-audit",
    },
)
ANA = f"arn:aws:sts::{ACCOUNT}:assumed-role/trainstack-dev-team-vision/ana"
BOB = f"arn:aws:sts::{ACCOUNT}:assumed-role/trainstack-dev-team-vision/bob"


def record(name: str, source: str, when: str, who: str, request: dict, response: dict | None = None, **extra):
    return {
        "eventVersion": "1.09",
        "userIdentity": {"type": "AssumedRole", "arn": who, "accountId": ACCOUNT},
        "eventTime": when,
        "eventSource": source,
        "eventName": name,
        "awsRegion": REGION,
        "sourceIPAddress": "192.0.2.10",
        "userAgent": "Boto3/1.44.8",
        "requestParameters": request,
        "responseElements": response,
        "eventID": f"{name}-{when}",
        "readOnly": False,
        "eventType": "AwsApiCall",
        "managementEvent": extra.pop("managementEvent", True),
        "recipientAccountId": ACCOUNT,
        "eventCategory": extra.pop("eventCategory", "Management"),
        **extra,
    }


SUBMIT = record(
    "SubmitJob",
    "batch.amazonaws.com",
    "2026-12-03T09:00:00Z",
    ANA,
    {"jobName": "llama-a", "jobQueue": "trainstack-dev-gpu-1a2b3c4", "shareIdentifier": "vision"},
    {"jobId": "6f1e0d2c-aaaa-bbbb-cccc-000000000001", "jobName": "llama-a"},
)
OTHER_SUBMIT = record(
    "SubmitJob",
    "batch.amazonaws.com",
    "2026-12-03T10:00:00Z",
    BOB,
    {"jobName": "llama-b", "jobQueue": "trainstack-dev-gpu-1a2b3c4"},
    {"jobId": "6f1e0d2c-aaaa-bbbb-cccc-000000000002", "jobName": "llama-b"},
)
TERMINATE = record(
    "TerminateJob",
    "batch.amazonaws.com",
    "2026-12-03T11:00:00Z",
    BOB,
    {"jobId": "6f1e0d2c-aaaa-bbbb-cccc-000000000001", "reason": "wrong data"},
)
POLICY_CHANGE = record(
    "PutRolePolicy", "iam.amazonaws.com", "2026-12-03T08:00:00Z", BOB, {"roleName": "trainstack-dev-job"}
)
DENIED = record(
    "ScheduleKeyDeletion",
    "kms.amazonaws.com",
    "2026-12-03T07:00:00Z",
    BOB,
    {"keyId": "1234abcd-12ab-34cd-56ef-1234567890ab"},
    errorCode="AccessDenied",
)
CHECKPOINT_WRITE = record(
    "PutObject",
    "s3.amazonaws.com",
    "2026-12-03T09:30:00Z",
    f"arn:aws:sts::{ACCOUNT}:assumed-role/trainstack-dev-job/ecs-task",
    {"bucketName": "trainstack-dev-checkpoints", "key": "llama-a/iter_0000100/__0_0.distcp"},
    managementEvent=False,
    eventCategory="Data",
)


def lookup_event(cloudtrail_record: dict, read_only: str = "false") -> dict:
    """One LookupEvents `Events` entry wrapping a record (CloudTrail API reference, Event)."""
    return {
        "EventId": cloudtrail_record["eventID"],
        "EventName": cloudtrail_record["eventName"],
        "ReadOnly": read_only,
        "EventTime": datetime.fromisoformat(cloudtrail_record["eventTime"]),
        "EventSource": cloudtrail_record["eventSource"],
        "Username": cloudtrail_record["userIdentity"]["arn"].rsplit("/", 1)[-1],
        "Resources": [],
        "CloudTrailEvent": json.dumps(cloudtrail_record),
    }


def in_region(region: str, cloudtrail: object):
    """`collect`'s client factory for a stack whose every lookup must go to `region`'s client."""

    def factory(asked: str) -> object:
        assert asked == region, f"LookupEvents in {asked}, expected {region}"
        return cloudtrail

    return factory


def stubbed_cloudtrail(
    by_source: dict[str, list[dict]], region: str = REGION, sources: tuple[str, ...] = audit.EVENT_SOURCES
) -> tuple[object, Stubber]:
    cloudtrail = boto3.client(
        "cloudtrail", region_name=region, aws_access_key_id="testing", aws_secret_access_key="testing"
    )
    stubber = Stubber(cloudtrail)
    for source in sources:
        stubber.add_response(
            "lookup_events",
            {"Events": by_source.get(source, [])},
            {
                "LookupAttributes": [{"AttributeKey": "EventSource", "AttributeValue": source}],
                "StartTime": SINCE,
                "EndTime": ANY,
            },
        )
    stubber.activate()
    return cloudtrail, stubber


MANAGEMENT = {
    "batch.amazonaws.com": [
        lookup_event(TERMINATE),
        lookup_event(OTHER_SUBMIT),
        lookup_event(SUBMIT),
        lookup_event({**SUBMIT, "eventName": "DescribeJobs", "eventID": "read"}, read_only="true"),
    ],
    "iam.amazonaws.com": [lookup_event(POLICY_CHANGE)],
    "kms.amazonaws.com": [lookup_event(DENIED)],
}


def test_management_events_are_listed_newest_first_without_reads():
    cloudtrail, stubber = stubbed_cloudtrail(MANAGEMENT)
    events = audit.collect(OUTPUTS, in_region(REGION, cloudtrail), None, SINCE, NOW)
    stubber.assert_no_pending_responses()
    assert [(e.time, e.action) for e in events] == [
        ("2026-12-03T11:00:00Z", "batch:TerminateJob"),
        ("2026-12-03T10:00:00Z", "batch:SubmitJob"),
        ("2026-12-03T09:00:00Z", "batch:SubmitJob"),
        ("2026-12-03T08:00:00Z", "iam:PutRolePolicy"),
        ("2026-12-03T07:00:00Z", "kms:ScheduleKeyDeletion"),
    ]
    assert events[2].who == ANA
    assert (
        events[2].target == "job llama-a (6f1e0d2c-aaaa-bbbb-cccc-000000000001) on trainstack-dev-gpu-1a2b3c4"
    )
    assert events[-1].error == "AccessDenied"


def test_a_us_west_2_stack_finds_its_iam_changes_in_us_east_1():
    """CloudTrail User Guide, "Global service events": IAM's events are recorded in us-east-1 whatever the region
    the call came from, so a us-west-2 stack's PutRolePolicy is in us-east-1's event history, not us-west-2's."""
    west = StackOutputs("prod", {**OUTPUTS.values, "region": "us-west-2"})
    global_sources = tuple(s for s in audit.EVENT_SOURCES if s in audit.GLOBAL_EVENT_SOURCES)
    regional_sources = tuple(s for s in audit.EVENT_SOURCES if s not in audit.GLOBAL_EVENT_SOURCES)
    assert global_sources == ("iam.amazonaws.com",)
    by_region = {
        "us-east-1": stubbed_cloudtrail(
            {"iam.amazonaws.com": [lookup_event({**POLICY_CHANGE, "awsRegion": "us-east-1"})]},
            "us-east-1",
            global_sources,
        ),
        "us-west-2": stubbed_cloudtrail(MANAGEMENT, "us-west-2", regional_sources),
    }
    events = audit.collect(west, lambda region: by_region[region][0], None, SINCE, NOW)
    for _, stubber in by_region.values():
        stubber.assert_no_pending_responses()
    assert ("iam:PutRolePolicy", "roleName trainstack-dev-job") in [(e.action, e.target) for e in events]
    # The lookup as it was (every source in the stack's region) finds no IAM change there.
    west_only, stubber = stubbed_cloudtrail({}, "us-west-2")
    before = audit.collect(west, lambda region: west_only, None, SINCE, NOW)
    assert [e for e in before if e.action.startswith("iam:")] == []


def put_log_file(s3, records: list[dict], day: str) -> None:
    key = f"AWSLogs/{ACCOUNT}/CloudTrail/{REGION}/{day}/{ACCOUNT}_CloudTrail_{REGION}_20261203T0930Z_a1b2.json.gz"
    s3.put_object(
        Bucket="trainstack-dev-audit-logs",
        Key=key,
        Body=gzip.compress(json.dumps({"Records": records}).encode()),
    )


@mock_aws
def test_a_run_shows_its_submission_its_stop_and_its_checkpoint_writes():
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket="trainstack-dev-audit-logs")
    other_bucket = {**CHECKPOINT_WRITE, "requestParameters": {"bucketName": "unrelated", "key": "llama-a/x"}}
    put_log_file(s3, [CHECKPOINT_WRITE, other_bucket], "2026/12/03")
    cloudtrail, _ = stubbed_cloudtrail(MANAGEMENT)
    events = audit.collect(OUTPUTS, in_region(REGION, cloudtrail), s3, SINCE, NOW, run="llama-a")
    assert [(e.action, e.who, e.kind) for e in events] == [
        ("batch:TerminateJob", BOB, "management"),
        ("s3:PutObject", CHECKPOINT_WRITE["userIdentity"]["arn"], "data"),
        ("batch:SubmitJob", ANA, "management"),
    ]
    assert events[1].target == "s3://trainstack-dev-checkpoints/llama-a/iter_0000100/__0_0.distcp"


def test_table_and_json_name_the_same_events(capsys):
    cloudtrail, _ = stubbed_cloudtrail(MANAGEMENT)
    events = audit.collect(OUTPUTS, in_region(REGION, cloudtrail), None, SINCE, NOW, run="llama-a")
    table = audit.render_table(events).splitlines()
    assert table[0].split() == ["time", "who", "action", "target", "kind", "error"]
    assert "batch:TerminateJob" in table[1] and "batch:SubmitJob" in table[2]
    assert json.loads(json.dumps([e.__dict__ for e in events]))[0]["action"] == "batch:TerminateJob"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, datetime(2026, 11, 27, 12, 0, tzinfo=UTC)),
        ("12h", datetime(2026, 12, 4, 0, 0, tzinfo=UTC)),
        ("2026-12-01", datetime(2026, 12, 1, tzinfo=UTC)),
    ],
)
def test_since_takes_durations_and_dates(value, expected):
    assert audit.parse_since(value, NOW) == expected


def test_bad_since_is_refused_with_what_is_valid(capsys):
    from trainer.__main__ import main

    assert main(["audit", "--stack", "dev", "--since", "last week"]) == 2
    assert "SINCE='last week': give a duration such as 7d or 12h" in capsys.readouterr().err


@mock_aws
def test_make_audit_prints_the_table_and_json(tmp_path, capsys, monkeypatch):
    """The verb end to end: outputs file in, the stubbed CloudTrail and moto's S3 as the stack's region clients."""
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket="trainstack-dev-audit-logs")
    outputs = tmp_path / "outputs.json"
    required = dict.fromkeys(
        (
            "job_queue",
            "job_definition",
            "ecr_repository_url",
            "fsx_file_system_id",
            "fsx_dns_name",
            "fsx_mount_name",
        ),
        "x",
    )
    outputs.write_text(
        json.dumps(
            {
                **OUTPUTS.values,
                **required,
                "log_group": "/trainstack/dev/jobs",
                "instance_type": "p4d.24xlarge",
                "node_count": 1,
                "gpus_per_node": 8,
            }
        )
    )
    from trainer.__main__ import main

    for fmt in ("table", "json"):
        cloudtrail, _ = stubbed_cloudtrail(MANAGEMENT)
        clients = {"cloudtrail": cloudtrail, "s3": s3}
        monkeypatch.setattr(audit, "client", lambda service, region, clients=clients: clients[service])
        monkeypatch.setattr(audit, "parse_since", lambda value, now: SINCE)
        assert (
            main(["audit", "--stack", "dev", "--outputs", str(outputs), "--run", "llama-a", "--format", fmt])
            == 0
        )
        printed = capsys.readouterr().out
        if fmt == "table":
            assert printed.splitlines()[0].split() == ["time", "who", "action", "target", "kind", "error"]
            assert "batch:TerminateJob" in printed.splitlines()[1]
        else:
            assert [e["action"] for e in json.loads(printed)] == ["batch:TerminateJob", "batch:SubmitJob"]
