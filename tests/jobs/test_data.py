"""`make data STACK=<env>` against a moto server (tests/jobs/conftest.py): the sources uploaded and listed, the
array job of shards and the merge that depends on it with their container overrides; then each child's and the
merge's own code run against the same S3, and the published dataset equal, byte for byte, to a local `prepare`."""

from __future__ import annotations

import json
import shutil
import sysconfig
from pathlib import Path

import pytest
from botocore.stub import Stubber

from trainer.aws.clients import client
from trainer.aws.outputs import load_outputs
from trainer.data.prepare import prepare_dataset
from trainer.data.validate import ValidationLimits
from trainer.jobs.data import (
    DataJobError,
    SourceObject,
    plan_shards,
    run_publish,
    run_shard,
    submit_data,
    vcpu_hours,
)

from .conftest import IMAGE_TAG, add_container_queue

STDLIB = Path(sysconfig.get_paths()["stdlib"])
DATA_VCPUS = 8


def add_data_queue(stack) -> None:
    """What infra/data_prep.py creates, in moto: the CPU queue and the container job definition."""
    definition = add_container_queue(
        stack,
        "data-queue",
        "trainstack-test-data",
        ["prepare", "--help"],
        {"VCPU": DATA_VCPUS, "MEMORY": DATA_VCPUS * 1945},
    )
    stack.outputs.update(data_job_queue="data-queue", data_job_definition=definition)
    stack.outputs_file.write_text(json.dumps(stack.outputs))


@pytest.fixture
def data_stack(stack):
    add_data_queue(stack)
    return stack


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, Path]:
    """Standard library sources as text files in nested folders (one repeated in a later folder), and a
    tokenizer trained once on part of them."""
    root = tmp_path_factory.mktemp("data") / "corpus"
    for package in ("json", "email"):
        for source in sorted((STDLIB / package).glob("*.py")):
            (root / package).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, root / package / f"{source.stem}.txt")
    (root / "zz").mkdir()
    shutil.copyfile(root / "json" / "decoder.txt", root / "zz" / "decoder-again.txt")
    vocab = root.parent / "vocab"
    prepare_dataset([str(root / "json")], str(vocab), vocab_size=1024)
    return root, Path(f"{vocab}.tokenizer.json")


def submitted(stack) -> list[dict]:
    return stack.requests("SubmitJob")


def test_a_local_corpus_is_uploaded_and_submitted_as_an_array_job_then_a_dependent_merge(data_stack, corpus):
    root, tokenizer = corpus
    outputs = load_outputs("test", str(data_stack.outputs_file))

    submission = submit_data(outputs, str(root), "stdlib", tokenizer, tag=IMAGE_TAG, shard_bytes=60_000)

    plan = submission.plan
    assert len(plan.shards) >= 3 and plan.shards[0][0] == 0 and plan.shards[-1][1] == len(plan.objects)
    assert all(a[1] == b[0] for a, b in zip(plan.shards, plan.shards[1:], strict=False))  # contiguous runs
    keys = [o.key for o in plan.objects]
    assert (
        keys[0] == "stdlib/.sources/email/__init__.txt" and keys[-1] == "stdlib/.sources/zz/decoder-again.txt"
    )
    shards, merge = submitted(data_stack)
    plan_uri = f"s3://trainstack-test-datasets/stdlib/.staging/{plan.version}/plan.json"
    assert shards["jobQueue"] == merge["jobQueue"] == "data-queue"
    # Never the stack's own definition, whose `:latest` the IMMUTABLE repository never receives: its revision with
    # the pushed tag (ECR User Guide, "Image tag mutability").
    assert shards["jobDefinition"] == merge["jobDefinition"] != data_stack.outputs["data_job_definition"]
    (revision,) = data_stack.client("batch").describe_job_definitions(
        jobDefinitions=[shards["jobDefinition"]]
    )["jobDefinitions"]
    assert (
        revision["containerProperties"]["image"] == f"{data_stack.outputs['ecr_repository_url']}:{IMAGE_TAG}"
    )
    assert shards["arrayProperties"] == {"size": len(plan.shards)}
    assert shards["containerOverrides"] == {
        "command": ["data", "shard", "--plan", plan_uri, "--region", "us-east-1"]
    }
    # Tagged at submission with the stack's own team value, so no team role can tag (and then stop) them.
    assert shards["tags"]["team"] == merge["tags"]["team"] == "_stack"
    assert merge["dependsOn"] == [{"jobId": submission.array_job_id}]
    assert "arrayProperties" not in merge
    assert merge["containerOverrides"] == {
        "command": ["data", "publish", "--plan", plan_uri, "--region", "us-east-1"]
    }
    assert submission.vcpus_per_job == DATA_VCPUS
    s3 = data_stack.client("s3")
    staged = s3.get_object(Bucket="trainstack-test-datasets", Key=f"stdlib/.staging/{plan.version}/plan.json")
    assert staged["ServerSideEncryption"] == "aws:kms"


@pytest.mark.slow  # every child's prepare (a worker pool each) and the merge, against the moto server: ~1 min
def test_the_children_and_the_merge_publish_what_a_local_prepare_writes_and_a_rerun_does_nothing(
    data_stack, corpus, tmp_path, monkeypatch
):
    root, tokenizer = corpus
    outputs = load_outputs("test", str(data_stack.outputs_file))
    limits = ValidationLimits(max_reject_rate=0.05)
    submission = submit_data(
        outputs, str(root), "stdlib", tokenizer, tag=IMAGE_TAG, shard_bytes=60_000, limits=limits
    )
    plan_uri = f"s3://trainstack-test-datasets/{submission.plan.staging}/plan.json"

    for index in range(len(submission.plan.shards)):  # what each array child runs, by its array index
        monkeypatch.setenv("AWS_BATCH_JOB_ARRAY_INDEX", str(index))
        run_shard("us-east-1", plan_uri, None, tmp_path / f"child-{index}")
    run_publish("us-east-1", plan_uri, tmp_path / "merge")

    files = sorted(p for p in root.rglob("*.txt"))
    local = prepare_dataset(
        [str(p) for p in files], str(tmp_path / "local" / "stdlib"), tokenizer=str(tokenizer), limits=limits
    )
    s3 = data_stack.client("s3")
    published = submission.plan.published_prefix
    for suffix in (".bin", ".idx", ".digests", ".tokenizer.json"):
        body = s3.get_object(Bucket="trainstack-test-datasets", Key=f"{published}{suffix}")["Body"].read()
        assert body == (tmp_path / "local" / f"stdlib{suffix}").read_bytes(), suffix
    manifest = json.loads(
        s3.get_object(Bucket="trainstack-test-datasets", Key=f"{published}.manifest.json")["Body"].read()
    )
    assert manifest["idx_sha256"] == local.manifest.idx_sha256
    assert manifest["validation"]["rejected"]["duplicate"] == 1
    puts = [json.loads(line) for line in data_stack.recording.read_text().splitlines()]
    uploads = [p["url"].split("?")[0] for p in puts if p["method"] == "PUT" and f"/{published}." in p["url"]]
    assert [url.rsplit(".", 1)[-1] for url in uploads] == ["bin", "idx", "json", "digests", "json"]
    assert uploads[-1].endswith(".manifest.json")  # the manifest last: it marks the version complete
    latest = json.loads(
        s3.get_object(Bucket="trainstack-test-datasets", Key="stdlib/latest.json")["Body"].read()
    )
    assert latest == {"version": submission.plan.version, "prefix": f"/fsx/datasets/{published}"}

    jobs_before = len(submitted(data_stack))
    again = submit_data(
        outputs, str(root), "stdlib", tokenizer, tag=IMAGE_TAG, shard_bytes=60_000, limits=limits
    )
    assert again.published and again.plan.version == submission.plan.version
    assert len(submitted(data_stack)) == jobs_before
    assert "already published" in again.summary()

    (root / "zz" / "new.txt").write_text("a changed input")
    try:
        changed = submit_data(
            outputs, str(root), "stdlib", tokenizer, tag=IMAGE_TAG, shard_bytes=60_000, limits=limits
        )
    finally:
        (root / "zz" / "new.txt").unlink()
    assert not changed.published and changed.plan.version != submission.plan.version
    old = s3.get_object(Bucket="trainstack-test-datasets", Key=f"{published}.manifest.json")["Body"].read()
    assert json.loads(old)["idx_sha256"] == manifest["idx_sha256"]  # the version in use stays as it was


def test_make_data_with_a_stack_submits_from_an_s3_source(data_stack, corpus, tmp_path):
    root, tokenizer = corpus
    s3 = data_stack.client("s3")
    s3.create_bucket(Bucket="raw-corpus")
    for path in sorted(root.rglob("*.txt"))[:6]:
        s3.upload_file(str(path), "raw-corpus", f"web/{path.relative_to(root).as_posix()}")

    done = data_stack.make(
        "data", "SRC=s3://raw-corpus/web/", f"TOKENIZER={tokenizer}", "NAME=web", f"IMAGE={IMAGE_TAG}"
    )

    assert done.returncode == 0, done.stderr
    assert "submitted 1 shard(s) of 6 object(s)" in done.stdout
    (job,) = [request for request in submitted(data_stack) if "shards" in request["jobName"]]
    assert "arrayProperties" not in job  # one shard: a plain job (an array has 2 to 10,000 children)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("no data outputs", "has no data_job_queue output"),
        ("no tokenizer", "--tokenizer '/nonexistent/tokenizer.json' is not a file"),
        ("empty source", "holds no objects matching"),
        ("missing local source", "--src '/nonexistent/corpus' does not exist"),
        ("unpushed image", "IMAGE=feedface: no such tag in "),
    ],
)
def test_bad_submissions_fail_before_anything_is_submitted(data_stack, corpus, change, message):
    root, tokenizer = corpus
    data_stack.client("s3").create_bucket(Bucket="empty-corpus")
    values = dict(data_stack.outputs)
    src, given, tag = str(root), tokenizer, IMAGE_TAG
    if change == "unpushed image":
        tag = "feedface"
    elif change == "no data outputs":
        values.pop("data_job_queue")
    elif change == "no tokenizer":
        given = Path("/nonexistent/tokenizer.json")
    elif change == "empty source":
        src = "s3://empty-corpus/nothing/"
    else:
        src = "/nonexistent/corpus"
    data_stack.outputs_file.write_text(json.dumps(values))
    outputs = load_outputs("test", str(data_stack.outputs_file))

    with pytest.raises(DataJobError, match=message):
        submit_data(outputs, src, "c", given, tag=tag)
    assert submitted(data_stack) == []


def test_shards_are_contiguous_runs_of_about_the_asked_size():
    objects = [
        SourceObject(key=f"k{i:02d}", size=size, etag="e") for i, size in enumerate([5, 5, 5, 5, 50, 5, 5])
    ]

    # 80 bytes in shards of about 20: four runs, cut where the running total passes 20, 40, 60.
    assert plan_shards(objects, 20) == [(0, 4), (4, 5), (5, 6), (6, 7)]
    assert plan_shards(objects, 40) == [(0, 5), (5, 7)]
    assert plan_shards(objects, 10**9) == [(0, 7)]
    assert len(plan_shards([SourceObject(key=f"k{i}", size=1, etag="e") for i in range(20_000)], 1)) == 10_000


def test_vcpu_hours_add_each_array_childs_run_time(monkeypatch):
    """DescribeJobs shaped by botocore's Batch model (the Stubber validates the response against it)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    batch = client("batch", "us-east-1")
    vcpus = [{"type": "VCPU", "value": "8"}, {"type": "MEMORY", "value": "15560"}]

    def job(job_id, **extra):
        return {
            "jobName": "n",
            "jobId": job_id,
            "jobQueue": "q",
            "status": "SUCCEEDED",
            "jobDefinition": "d",
            "startedAt": 0,
            "container": {"resourceRequirements": vcpus},
            **extra,
        }

    with Stubber(batch) as stub:
        stub.add_response(
            "describe_jobs",
            {"jobs": [job("array", arrayProperties={"size": 2}), job("merge", stoppedAt=1_800_000)]},
            {"jobs": ["array", "merge"]},
        )
        stub.add_response(
            "describe_jobs",
            {
                "jobs": [
                    job("array:0", stoppedAt=3_600_000, arrayProperties={"index": 0}),
                    job("array:1", stoppedAt=7_200_000, arrayProperties={"index": 1}),
                ]
            },
            {"jobs": ["array:0", "array:1"]},
        )
        assert vcpu_hours(batch, ["array", "merge"]) == pytest.approx(8 * 0.5 + 8 * 1 + 8 * 2)
