"""`make audit STACK=<env> [RUN=name] [SINCE=7d|2026-12-01]`: who submitted, cancelled and changed what, newest first.

Two sources (docs/security.md#audit-trail):
- management events from CloudTrail `LookupEvents` (the last 90 days of the account's event history, whatever trail
  exists), one lookup per service the stack's control plane lives in, keeping writes only (`ReadOnly` false); a
  global service's (IAM's) in us-east-1, where CloudTrail records them whatever the stack's region (CloudTrail User
  Guide, "Global service events": events of IAM, STS and CloudFront "will be recorded in ... us-east-1"; "update
  the Region of your lookup-events API calls to view global service events");
- S3 data events (object writes and deletes in the datasets and checkpoints buckets), which event history does not
  hold: read from the stack trail's log files, `AWSLogs/<account>/CloudTrail/<region>/<yyyy>/<mm>/<dd>/*.json.gz`
  (CloudTrail User Guide, "CloudTrail log file examples" / "Finding your CloudTrail log files").

On an EKS stack, a third: the cluster's own audit log (trainer/jobs/k8s_audit.py), writes only.

With RUN, only that run's jobs (submitted with its name, then cancelled or terminated by job id) and its objects.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from trainer.aws.clients import client
from trainer.aws.outputs import StackError, StackOutputs, load_outputs
from trainer.jobs import k8s_audit

# The services whose writes change what the stack runs or who may touch it.
EVENT_SOURCES = (
    "batch.amazonaws.com",
    "iam.amazonaws.com",
    "kms.amazonaws.com",
    "cloudtrail.amazonaws.com",
    "s3.amazonaws.com",
)
# Of those, the global services, whose events CloudTrail records in GLOBAL_SERVICE_REGION (see above).
GLOBAL_EVENT_SOURCES = ("iam.amazonaws.com",)
GLOBAL_SERVICE_REGION = "us-east-1"
JOB_STOPS = ("CancelJob", "TerminateJob")
DATA_WRITES = ("PutObject", "DeleteObject", "DeleteObjects", "CompleteMultipartUpload", "CopyObject")
DEFAULT_SINCE = timedelta(days=7)
_RELATIVE = re.compile(r"^(\d+)([dh])$")


class AuditError(ValueError):
    """Bad input to make audit: names the variable, its value and what is valid."""


@dataclass(frozen=True)
class AuditEvent:
    time: str  # ISO 8601, UTC
    who: str
    action: str  # <service>:<EventName>
    target: str
    kind: str  # "management", "data" or "kubernetes" (an EKS cluster's audit log)
    error: str = ""


def parse_since(value: str | None, now: datetime) -> datetime:
    if not value:
        return now - DEFAULT_SINCE
    if match := _RELATIVE.match(value):
        amount, unit = int(match.group(1)), match.group(2)
        return now - (timedelta(days=amount) if unit == "d" else timedelta(hours=amount))
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise AuditError(
            f"SINCE={value!r}: give a duration such as 7d or 12h, or a UTC date/time such as 2026-12-01 "
            "or 2026-12-01T08:00"
        ) from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _who(record: dict[str, Any]) -> str:
    identity = record.get("userIdentity") or {}
    return str(identity.get("arn") or identity.get("invokedBy") or identity.get("type") or "unknown")


def _target(record: dict[str, Any]) -> str:
    request = record.get("requestParameters") or {}
    response = record.get("responseElements") or {}
    if "jobName" in request:
        return f"job {request['jobName']} ({response.get('jobId', '?')}) on {request.get('jobQueue', '?')}"
    if "jobId" in request:
        return f"job {request['jobId']}"
    if "bucketName" in request:
        return f"s3://{request['bucketName']}/{request.get('key', '')}"
    for key in ("roleName", "policyArn", "policyName", "keyId", "name", "jobQueue", "jobDefinitionName"):
        if key in request:
            return f"{key} {request[key]}"
    return ""


def _event(record: dict[str, Any], kind: str) -> AuditEvent:
    return AuditEvent(
        time=str(record.get("eventTime", "")),
        who=_who(record),
        action=f"{str(record.get('eventSource', '')).split('.')[0]}:{record.get('eventName', '')}",
        target=_target(record),
        kind=kind,
        error=str(record.get("errorCode", "")),
    )


def lookup_region(source: str, stack_region: str) -> str:
    """Where event history holds `source`'s events: us-east-1 for a global service, else the stack's region."""
    return GLOBAL_SERVICE_REGION if source in GLOBAL_EVENT_SOURCES else stack_region


def management_records(
    cloudtrail: Callable[[str], Any], region: str, since: datetime, until: datetime
) -> Iterator[dict[str, Any]]:
    """Write events of the watched services, as CloudTrail records (LookupEvents' `CloudTrailEvent` JSON), each
    looked up in its `lookup_region` through `cloudtrail(region)`. LookupEvents takes one attribute per call and is
    throttled per account and region (CloudTrail API reference): one call per service, the client's adaptive
    retries absorb the throttling."""
    for source in EVENT_SOURCES:
        pages = (
            cloudtrail(lookup_region(source, region))
            .get_paginator("lookup_events")
            .paginate(
                LookupAttributes=[{"AttributeKey": "EventSource", "AttributeValue": source}],
                StartTime=since,
                EndTime=until,
            )
        )
        for page in pages:
            for event in page["Events"]:
                if event.get("ReadOnly") == "true":
                    continue
                yield json.loads(event["CloudTrailEvent"])


def data_records(
    s3: Any, bucket: str, account: str, region: str, buckets: Iterable[str], since: datetime, until: datetime
) -> Iterator[dict[str, Any]]:
    """Object writes and deletes in `buckets`, from the trail's log files of each day in [since, until]."""
    watched = set(buckets)
    day: date = since.date()
    while day <= until.date():
        prefix = f"AWSLogs/{account}/CloudTrail/{region}/{day:%Y/%m/%d}/"
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                body = s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
                for record in json.loads(gzip.decompress(body))["Records"]:
                    request = record.get("requestParameters") or {}
                    if record.get("eventName") in DATA_WRITES and request.get("bucketName") in watched:
                        yield record
        day += timedelta(days=1)


def for_run(records: list[tuple[dict[str, Any], str]], run: str) -> list[tuple[dict[str, Any], str]]:
    """The run's job submissions, the stops of those jobs, and writes under its checkpoint or dataset prefix."""
    job_ids = {
        (r.get("responseElements") or {}).get("jobId")
        for r, _ in records
        if r.get("eventName") == "SubmitJob" and (r.get("requestParameters") or {}).get("jobName") == run
    }
    kept = []
    for record, kind in records:
        request = record.get("requestParameters") or {}
        if (
            (record.get("eventName") == "SubmitJob" and request.get("jobName") == run)
            or (record.get("eventName") in JOB_STOPS and request.get("jobId") in job_ids)
            or (kind == "data" and f"{run}/" in str(request.get("key", "")))
        ):
            kept.append((record, kind))
    return kept


def collect(
    outputs: StackOutputs,
    cloudtrail: Callable[[str], Any],
    s3: Any | None,
    since: datetime,
    until: datetime,
    run: str | None = None,
) -> list[AuditEvent]:
    records = [(r, "management") for r in management_records(cloudtrail, outputs.region, since, until)]
    trail_bucket = outputs.values.get("audit_bucket")
    if s3 is not None and trail_bucket:
        account = outputs["kms_key_arn"].split(":")[4]
        buckets = (outputs["datasets_bucket"], outputs["checkpoints_bucket"])
        records += [
            (r, "data")
            for r in data_records(s3, str(trail_bucket), account, outputs.region, buckets, since, until)
        ]
    if run:
        records = for_run(records, run)
    events = [_event(record, kind) for record, kind in records]
    return sorted(events, key=lambda e: e.time, reverse=True)


def cluster_events(
    logs: Any, cluster: str, since: datetime, until: datetime, run: str | None = None
) -> list[AuditEvent]:
    """Writes in an EKS stack's cluster from its audit log (trainer/jobs/k8s_audit.py); with RUN, its JobSet's."""
    return [
        AuditEvent(**k8s_audit.fields(record), kind="kubernetes")
        for record in k8s_audit.records(logs, cluster, since, until)
        if run is None or k8s_audit.for_run(record, run)
    ]


def render_table(events: list[AuditEvent]) -> str:
    columns = ("time", "who", "action", "target", "kind", "error")
    rows = [columns, *([getattr(e, c) for c in columns] for e in events)]
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(columns))]
    return "\n".join(
        "  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in rows
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", required=True)
    parser.add_argument("--outputs", help="a JSON file of stack outputs instead of `pulumi stack output`")
    parser.add_argument("--run", help="only this run's jobs and objects")
    parser.add_argument("--since", help="how far back: 7d, 12h, or a UTC date/time (default 7d)")
    parser.add_argument("--format", choices=("table", "json"), default="table")


def main(args: argparse.Namespace) -> int:
    now = datetime.now(UTC)
    try:
        since = parse_since(args.since, now)
        outputs = load_outputs(args.stack, args.outputs)
    except (AuditError, StackError) as error:
        print(f"audit: {error}", file=sys.stderr)
        return 2
    events = collect(
        outputs,
        lambda region: client("cloudtrail", region),
        client("s3", outputs.region),
        since,
        now,
        args.run,
    )
    if cluster := outputs.values.get("eks_cluster_name"):  # an EKS stack: its control plane's audit log too
        events = sorted(
            [*events, *cluster_events(client("logs", outputs.region), str(cluster), since, now, args.run)],
            key=lambda e: e.time,
            reverse=True,
        )
    if args.format == "json":
        print(json.dumps([asdict(e) for e in events], indent=2))
    else:
        print(render_table(events))
        if not outputs.values.get("audit_bucket"):
            print(
                f"note: {outputs.values.get('audit_trail', 'the trail')} is not the stack's own: S3 data events "
                "are in the organisation's log bucket, not listed here"
            )
    return 0
