"""The continuous-delivery gate (trainer/deploy/gate.py, a suite's `deploy:`) and `make finetune DEPLOY=1`'s last
stage (trainer/jobs/finetune.py `deliver`) against the same moto bucket and stubbed SageMaker as test_deploy."""

from __future__ import annotations

import pytest
from botocore.stub import ANY
from pydantic import ValidationError

from tests.deploy.test_deploy import ENDPOINT, Fake, answer_of, ready_runs, run_matching_config
from tests.models.test_registry import BUCKET, bucket, exported, lineage, runs  # noqa: F401
from trainer.deploy import endpoint as ep
from trainer.deploy.gate import verdict
from trainer.evaluation.suite import DeployGate, Suite
from trainer.jobs import finetune
from trainer.models.registry import Registry, S3Store


def entry(**figures) -> dict:
    return {
        "name": "sft",
        "results": {"generation": {"answers": figures}, "perplexity": {"heldout": figures}},
    }


@pytest.mark.parametrize(
    ("metric", "new", "live", "opens"),
    [
        ("generation.answers.exact_match", 0.62, 0.60, True),  # higher by the margin
        ("generation.answers.exact_match", 0.61, 0.60, False),  # higher, by less
        ("generation.answers.exact_match", 0.50, 0.60, False),
        ("perplexity.heldout.perplexity", 3.0, 3.5, True),  # lower is better
        ("perplexity.heldout.perplexity", 3.49, 3.5, False),
    ],
)
def test_the_new_version_must_beat_the_live_one_by_the_margin(metric, new, live, opens):
    gate = DeployGate(metric=metric, margin=0.02)
    figure = metric.rsplit(".", 1)[1]
    got, why = verdict(gate, entry(**{figure: new}), entry(**{figure: live}))
    assert got is opens and f"{new:g} vs live {live:g}" in why


def test_nothing_live_opens_the_gate_and_no_figure_keeps_it_shut():
    gate = DeployGate(metric="generation.answers.exact_match", margin=0.5)
    assert verdict(gate, entry(exact_match=0.1), None)[0] is True
    assert verdict(gate, {"results": {}}, None) == (
        False,
        "the new version's evaluation has no " + gate.metric,
    )


def test_a_gate_naming_no_figure_of_the_suite_is_refused_with_the_valid_ones():
    with pytest.raises(ValidationError, match=r"valid: generation\.answers\.exact_match"):
        Suite.model_validate(
            {
                "generation": [{"name": "answers", "file": "t.jsonl"}],
                "deploy": {"metric": "generation.other.exact_match", "margin": 0.01},
            }
        )


@pytest.fixture
def world(bucket, runs, tmp_path):  # noqa: F811
    s3, key = bucket
    versions = ready_runs(runs)
    exported(s3, runs)
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        "generation:\n  - {name: sum, file: t.jsonl}\ndeploy: {metric: generation.sum.exact_match, margin: 0.01}\n"
    )
    return (
        Fake(s3, key),
        Registry(S3Store(s3, None, BUCKET, key)),
        versions,
        suite,
        S3Store(s3, None, BUCKET, key),
    )


def test_a_version_that_does_not_beat_the_live_one_is_held_back(world, capsys):
    fake, _, (older, newest), suite, store = world
    fake.live(older)  # both evaluations record exact_match 1.0: no gain
    with fake.sm:
        assert finetune.deliver(suite, "sft", newest, fake.clients, fake.pool, store, 0) == 0
        fake.sm.assert_no_pending_responses()  # no Model, no update
    assert f"held back: {newest} does not beat {older}" in capsys.readouterr().out


def test_with_nothing_live_the_stage_deploys_the_new_version(world, capsys, monkeypatch):
    fake, registry, (_, newest), suite, store = world
    monkeypatch.setattr(store, "caller", lambda: "pipeline")
    fake.no_endpoint()  # the gate's look
    fake.no_endpoint()  # deploy's own
    fake.creates(update=False)
    fake.status("InService", config=ANY)
    fake.answers(answer_of(newest))

    def deliver():
        return finetune.deliver(suite, "sft", newest, fake.clients, fake.pool, store, 0, sleep=lambda s: None)

    assert run_matching_config(fake, registry, newest, call=deliver) == 0
    out = capsys.readouterr().out
    assert f"deploy: {newest} passes the gate (no version is live" in out and f"is live on {ENDPOINT}" in out
    [record] = ep.deployments(fake.clients, registry.versions, ENDPOINT)
    assert (record["version"], record["by"]) == (newest, "pipeline")
