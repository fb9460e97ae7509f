"""`make sweep STACK=<env> TRIALS=32 PARALLEL=4` against the moto stack (tests/jobs/conftest.py): one Batch array job
of sweep workers on the single-node GPU queue, found again by name instead of submitted twice; on an EKS stack one
JobSet of Indexed workers, received by the API server's stand-in (tests/jobs/test_eks.py) and checked against the
pinned JobSet CRD."""

from __future__ import annotations

import json
import threading
import time

import pytest

from trainer.aws.outputs import load_outputs
from trainer.jobs.sweep import follow

from .conftest import IMAGE_TAG, Stack, add_container_queue
from .jobset_schema import jobset_errors
from .test_eks import ApiServer, api_server, eks_stack, teams_stack, trainer  # noqa: F401  (fixtures)
from .test_one_job_per_run import hold_running

# The workers' arguments for team vision's sweep `lr` of 32 trials under a $500 cap: the node's one process (not a
# torchrun rank: each of its trials trains on the node's GPUs), the shared study under the team's prefix.
VISION_LR_WORKER = [
    *("--direct", "sweep-worker", "--sweep", "trainer/configs/llama3-8b-sweep.yaml", "--name", "lr"),
    *("--dir", "/fsx/checkpoints/teams/vision/sweeps/lr", "--trials", "32", "--max-dollars", "500"),
]
TEAMS = {"teams": ["vision", "speech"], "team_gpu_quotas": {"vision": 32, "speech": 32}}


def with_single_node_queue(stack: Stack) -> None:
    """What infra/cluster.py `_spot` adds, in moto: the Spot queue and its single-node GPU job definition; and
    teams."""
    definition = add_container_queue(
        stack,
        "spot-queue",
        "trainstack-test-spot",
        ["train", "--help"],
        {"VCPU": 188, "MEMORY": 1900000, "GPU": 8},
    )
    stack.outputs.update(spot_job_queue="spot-queue", spot_job_definition=definition, **TEAMS)
    stack.outputs_file.write_text(json.dumps(stack.outputs))


def request_job_id(stack: Stack, name: str) -> str:
    found = stack.client("batch").list_jobs(
        jobQueue="spot-queue", filters=[{"name": "JOB_NAME", "values": [name]}]
    )
    return str(found["jobSummaryList"][0]["jobId"])


def held_running(stack: Stack, name: str):
    """The job named `name`, made RUNNING (moto ends a job at once)."""
    return hold_running(request_job_id(stack, name))


@pytest.fixture
def sweep_stack(stack):
    with_single_node_queue(stack)
    return stack


@pytest.mark.slow
def test_make_sweep_submits_one_array_job_of_workers_and_a_rerun_follows_it(sweep_stack):
    args = ("TRIALS=32", "PARALLEL=4", "MAX_DOLLARS=500", "TEAM=vision", f"IMAGE={IMAGE_TAG}", "NAME=lr")
    result = sweep_stack.make("sweep", *args, "ARGS=--no-follow")
    assert result.returncode == 0, result.stderr
    assert "submitted sweep-lr" in result.stdout
    [request] = sweep_stack.requests("SubmitJob")
    assert request["jobName"] == "sweep-lr"
    assert request["jobQueue"] == "spot-queue"
    assert request["arrayProperties"] == {"size": 4}
    # The single-node definition, at a revision naming the pushed image (trainer/jobs/submit.py job_definition_for).
    [definition] = sweep_stack.client("batch").describe_job_definitions(
        jobDefinitions=[request["jobDefinition"]]
    )["jobDefinitions"]
    assert definition["jobDefinitionName"] == "trainstack-test-spot"
    assert definition["containerProperties"]["image"].endswith(f":{IMAGE_TAG}")
    assert request["containerOverrides"]["command"] == VISION_LR_WORKER
    environment = {e["name"]: e["value"] for e in request["containerOverrides"]["environment"]}
    assert environment == {"TRAINSTACK_SWEEP": "lr", "TRAINSTACK_IMAGE_TAG": IMAGE_TAG}
    # The team's tag, share and priority, as every job of a team carries (trainer/jobs/teams.py).
    assert request["tags"] == {
        "trainstack:run": "sweep-lr",
        "trainstack:stack": "test",
        "team": "vision",
    }
    assert request["shareIdentifier"] == "vision" and request["schedulingPriorityOverride"] == 0
    assert request["propagateTags"] is True

    # The driver interrupted and run again while the workers run: the job is found by its name and followed, not
    # submitted a second time (moto ends a job at once: it is held RUNNING here, then ended while followed).
    job = held_running(sweep_stack, "sweep-lr")

    # Ended once the rerun has looked it up: its ListJobs saw it RUNNING, then its DescribeJobs read the team tag
    # (trainer/jobs/job.py batch_run_jobs); the follower then sees it end.
    def end_once_followed() -> None:
        deadline = time.monotonic() + 60
        while not sweep_stack.recorded("describejobs") and time.monotonic() < deadline:
            time.sleep(0.1)
        job.status = "SUCCEEDED"

    ender = threading.Thread(target=end_once_followed)
    ender.start()
    again = sweep_stack.make("sweep", *args, "ARGS=--poll 0.2")
    ender.join()
    assert again.returncode == 0, again.stderr
    assert len(sweep_stack.requests("SubmitJob")) == 1
    assert f"following sweep-lr ({job.job_id}, RUNNING), submitted before" in again.stdout
    assert again.stdout.rstrip().splitlines()[-1] == "sweep-lr: SUCCEEDED: 4 succeeded"  # the children too
    # Once it has ended well, the same command reports it and submits nothing.
    done = sweep_stack.make("sweep", *args, "ARGS=--no-follow")
    assert f"sweep-lr ({job.job_id}) already ended: SUCCEEDED" in done.stdout
    assert len(sweep_stack.requests("SubmitJob")) == 1
    # Continued past its TRIALS (or with another cap): the ended job ran another command, so the study's job is
    # submitted again under the same name, and the study resumes.
    more = sweep_stack.make("sweep", *args[1:], "TRIALS=40", "ARGS=--no-follow")
    assert more.returncode == 0, more.stderr
    assert "again (the last one ended with another TRIALS or cap; the study resumes)" in more.stdout
    first, second = sweep_stack.requests("SubmitJob")
    assert first["jobName"] == second["jobName"] == "sweep-lr"
    assert second["containerOverrides"]["command"] == [*VISION_LR_WORKER[:9], "40", *VISION_LR_WORKER[10:]]


def test_a_live_sweep_with_other_trials_or_cap_is_refused_and_an_ended_one_continues(sweep_stack):
    """One live job per study: a second job's worker 0 would take the live worker 0's running trial for its own
    interrupted one, fail it, and crash the live worker when it reports it. Once that job has ended with its cap
    reached, a higher cap submits the study's job again."""
    args = ("PARALLEL=1", "TEAM=vision", f"IMAGE={IMAGE_TAG}", "NAME=lr")
    first = sweep_stack.make("sweep", *args, "TRIALS=32", "MAX_DOLLARS=500", "ARGS=--no-follow")
    assert first.returncode == 0, first.stderr
    job = held_running(sweep_stack, "sweep-lr")
    for other, asked in (
        (("TRIALS=40", "MAX_DOLLARS=500"), "TRIALS=40, MAX_DOLLARS=500"),
        (("TRIALS=32", "MAX_DOLLARS=900"), "TRIALS=32, MAX_DOLLARS=900"),
        (("TRIALS=32",), "TRIALS=32, MAX_DOLLARS=none"),
    ):
        refused = sweep_stack.make("sweep", *args, *other, "ARGS=--no-follow")
        assert refused.returncode == 2
        where = f"STACK=test TEAM=vision JOB={job.job_id}"
        assert (
            f"NAME=lr: sweep-lr ({job.job_id}) is RUNNING on this study with TRIALS=32, MAX_DOLLARS=500; this "
            f"asks for {asked}. One job runs a study at a time (two would take each other's trials): wait for it "
            f"to end (make status {where}) or cancel it (make cancel {where}), then run this again"
        ) in refused.stderr, refused.stderr
    assert len(sweep_stack.requests("SubmitJob")) == 1 and sweep_stack.requests("TerminateJob") == []
    # Ended (its cap reached): the same command reports it, a higher cap continues the study.
    job.status, job.job_stopped = "SUCCEEDED", True
    same = sweep_stack.make("sweep", *args, "TRIALS=32", "MAX_DOLLARS=500", "ARGS=--no-follow")
    assert f"sweep-lr ({job.job_id}) already ended: SUCCEEDED" in same.stdout, same.stderr
    assert len(sweep_stack.requests("SubmitJob")) == 1
    higher = sweep_stack.make("sweep", *args, "TRIALS=32", "MAX_DOLLARS=900", "ARGS=--no-follow")
    assert higher.returncode == 0, higher.stderr
    assert "again (the last one ended with another TRIALS or cap; the study resumes)" in higher.stdout
    [_, request] = sweep_stack.requests("SubmitJob")
    assert request["jobName"] == "sweep-lr"
    assert request["containerOverrides"]["command"][-2:] == ["--max-dollars", "900"]


def test_a_stack_sweep_passes_its_tracking_server_to_every_worker(sweep_stack):
    uri = "http://mlflow.internal:5000"
    result = sweep_stack.make(
        "sweep",
        "TRIALS=8",
        "PARALLEL=2",
        "TEAM=vision",
        f"IMAGE={IMAGE_TAG}",
        f"MLFLOW={uri}",
        "ARGS=--no-follow",
    )
    assert result.returncode == 0, result.stderr
    [request] = sweep_stack.requests("SubmitJob")
    command = request["containerOverrides"]["command"]
    assert command[command.index("sweep-worker") :][-2:] == ["--mlflow", uri]


def test_following_prints_the_array_jobs_status_until_it_ends(sweep_stack, capsys):
    result = sweep_stack.make(
        "sweep", "TRIALS=8", "PARALLEL=2", f"IMAGE={IMAGE_TAG}", "TEAM=speech", "ARGS=--no-follow"
    )
    assert result.returncode == 0, result.stderr
    [request] = sweep_stack.requests("SubmitJob")
    outputs = load_outputs("test", sweep_stack.outputs_file)
    status = follow(outputs, request_job_id(sweep_stack, request["jobName"]), poll_s=0.2)
    assert status in ("SUCCEEDED", "FAILED")
    printed = capsys.readouterr().out
    assert printed.rstrip().splitlines()[-1].startswith(f"{request['jobName']}: {status}")


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        (("PARALLEL=9", "TRIALS=8"), "PARALLEL=9: give 1 to 8 (at most TRIALS=8)"),
        (("NAME=lr.v2",), "NAME='lr.v2': on a stack use letters, digits, '-' and '_'"),
        (("SWEEP=tests/support/tiny.yaml",), "the image carries trainer/ only"),
        (("TEAM=audio",), "TEAM=audio: not a team of stack 'test'"),
        (
            ("PARALLEL=2", "TEAM=vision", "TRIALS=2", "ARGS=--set schedule.train_iters=0"),
            "schedule.train_iters",
        ),
    ],
)
def test_bad_sweeps_are_refused_before_anything_is_submitted(sweep_stack, variables, message):
    result = sweep_stack.make("sweep", f"IMAGE={IMAGE_TAG}", "TEAM=vision", *variables)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr
    assert sweep_stack.requests("SubmitJob") == []


def test_a_stack_without_a_single_node_queue_is_refused(stack):
    stack.outputs_file.write_text(json.dumps(stack.outputs))
    result = stack.make("sweep", f"IMAGE={IMAGE_TAG}", "PARALLEL=2")
    assert result.returncode == 2
    assert "has no single-node GPU queue (spot_job_queue, spot_job_definition)" in result.stderr
    assert stack.requests("SubmitJob") == []


# On EKS: the same sweep as one JobSet in the team's namespace.
EKS_SWEEP = ("--sweep", "trainer/configs/llama3-8b-sweep.yaml", "--name", "lr", "--image", IMAGE_TAG)


def eks_sweep(stack: Stack, capsys, *argv: str) -> tuple[int, str, str]:
    return trainer(stack, capsys, "sweep-stack", *EKS_SWEEP, "--team", "vision", *argv)


LR_32 = ("--trials", "32", "--parallel", "4", "--max-dollars", "500")


def test_an_eks_sweep_is_one_indexed_jobset_and_a_rerun_follows_it(teams_stack, api_server, capsys):  # noqa: F811
    status, out, err = eks_sweep(teams_stack, capsys, *LR_32, "--no-follow")
    assert status == 0, err
    assert "submitted JobSet sweep-lr: 4 workers, 32 trials" in out
    [jobset] = api_server.received
    assert jobset_errors(jobset) == []  # the pinned JobSet v0.12.0 CRD, unknown fields rejected
    assert jobset["metadata"]["namespace"] == "team-vision" and jobset["metadata"]["name"] == "sweep-lr"
    assert jobset["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "training"  # Kueue admits it whole
    [replicated] = jobset["spec"]["replicatedJobs"]
    job = replicated["template"]["spec"]
    assert (replicated["replicas"], job["completionMode"], job["completions"], job["parallelism"]) == (
        1,
        "Indexed",  # each pod's JOB_COMPLETION_INDEX is its worker index (trainer/sweep/worker.py)
        4,
        4,
    )
    pod = job["template"]["spec"]
    assert pod["serviceAccountName"] == "trainer"  # the team's Pod Identity: its S3 prefix only
    [container] = pod["containers"]
    assert container["args"] == VISION_LR_WORKER  # the same worker as on Batch, its journal on the FSx claim
    assert container["image"].endswith(f":{IMAGE_TAG}")
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"  # one worker a node
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TRAINSTACK_SWEEP"] == "lr" and env["TRAINSTACK_IMAGE_TAG"] == IMAGE_TAG
    # The team's own directories only (infra/eks_teams.py team_volumes): the journal under its checkpoints one.
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts["/fsx/checkpoints/teams/vision"] == "fsx-checkpoints" and "/fsx" not in mounts
    assert {"name": "fsx-checkpoints", "persistentVolumeClaim": {"claimName": "fsx-checkpoints"}} in pod[
        "volumes"
    ]

    # The driver run again while the workers run: the JobSet is found in the team's namespace and followed.
    held = api_server.namespaces["team-vision"]["sweep-lr"]
    held["status"] = {"replicatedJobsStatus": [{"name": "node", "active": 4, "ready": 4, "succeeded": 0}]}
    seen = len(api_server.callers)

    def end_once_followed() -> None:  # after the follower's first read of it
        deadline = time.monotonic() + 60
        while len(api_server.callers) < seen + 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        held["status"] = {
            "conditions": [
                {"type": "Completed", "status": "True", "lastTransitionTime": "2026-12-05T12:00:00Z"}
            ],
            "replicatedJobsStatus": [{"name": "node", "active": 0, "succeeded": 1}],
        }

    ender = threading.Thread(target=end_once_followed)
    ender.start()
    status, out, err = eks_sweep(teams_stack, capsys, *LR_32, "--poll", "0.1")
    ender.join()
    assert status == 0, err
    assert len(api_server.received) == 1
    assert "following sweep-lr (sweep-lr, RUNNING), submitted before" in out
    lines = out.rstrip().splitlines()
    assert "sweep-lr: RUNNING: 4 active" in lines and lines[-1] == "sweep-lr: SUCCEEDED: 1 succeeded"
    # Ended well: reported, nothing submitted.
    status, out, _ = eks_sweep(teams_stack, capsys, *LR_32, "--no-follow")
    assert status == 0 and "sweep-lr (sweep-lr) already ended: SUCCEEDED" in out
    assert len(api_server.received) == 1 and api_server.deletions == []


def test_a_failed_eks_sweep_is_deleted_and_submitted_again(teams_stack, api_server, capsys):  # noqa: F811
    assert eks_sweep(teams_stack, capsys, "--trials", "8", "--parallel", "2", "--no-follow")[0] == 0
    api_server.namespaces["team-vision"]["sweep-lr"]["status"] = {
        "conditions": [{"type": "Failed", "status": "True", "lastTransitionTime": "2026-12-05T12:00:00Z"}]
    }
    status, out, err = eks_sweep(teams_stack, capsys, "--trials", "8", "--parallel", "2", "--no-follow")
    assert status == 0, err
    assert "submitted JobSet sweep-lr again (the last one failed; the study resumes)" in out
    assert [(d["name"], d["namespace"]) for d in api_server.deletions] == [("sweep-lr", "team-vision")]
    assert len(api_server.received) == 2 and list(api_server.namespaces["team-vision"]) == ["sweep-lr"]


def test_a_live_eks_sweep_with_another_cap_is_refused_and_an_ended_one_continues(
    teams_stack,  # noqa: F811
    api_server,  # noqa: F811
    capsys,
):
    argv = ("--trials", "8", "--parallel", "2", "--no-follow")
    assert eks_sweep(teams_stack, capsys, *argv, "--max-dollars", "100")[0] == 0
    status, _, err = eks_sweep(teams_stack, capsys, *argv, "--max-dollars", "200")
    assert status == 2
    assert (
        "NAME=lr: sweep-lr (sweep-lr) is SUBMITTED on this study with TRIALS=8, MAX_DOLLARS=100; this asks for "
        "TRIALS=8, MAX_DOLLARS=200"
    ) in err, err
    assert "make cancel STACK=test TEAM=vision JOB=sweep-lr" in err
    assert len(api_server.received) == 1 and api_server.deletions == []
    api_server.namespaces["team-vision"]["sweep-lr"]["status"] = {
        "conditions": [{"type": "Completed", "status": "True", "lastTransitionTime": "2026-12-05T12:00:00Z"}]
    }
    status, out, _ = eks_sweep(teams_stack, capsys, *argv, "--max-dollars", "100")
    assert status == 0 and "sweep-lr (sweep-lr) already ended: SUCCEEDED" in out
    assert len(api_server.received) == 1
    # A higher cap: the ended JobSet (its name stays taken) is deleted and the study's JobSet created again.
    status, out, err = eks_sweep(teams_stack, capsys, *argv, "--max-dollars", "200")
    assert status == 0, err
    assert "submitted JobSet sweep-lr again (the last one ended with another TRIALS or cap" in out
    assert [(d["name"], d["namespace"]) for d in api_server.deletions] == [("sweep-lr", "team-vision")]
    pod = api_server.received[1]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["args"][-2:] == ["--max-dollars", "200"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--name", "LR"), "NAME='LR': the sweep's JobSet is named 'sweep-LR', which EKS refuses"),
        (("--team", "audio"), "TEAM=audio: not a team of stack 'test'"),
        (("--parallel", "33"), "PARALLEL=33: give 1 to 32"),
        (("--image", "fedcba987654"), "IMAGE=fedcba987654: no such tag"),
    ],
)
def test_bad_eks_sweeps_call_no_cluster(teams_stack, api_server, capsys, argv, message):  # noqa: F811
    status, _, err = eks_sweep(teams_stack, capsys, *argv)
    assert status == 2 and message in err, err
    assert api_server.received == [] and api_server.callers == []
