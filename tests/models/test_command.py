"""`python -m trainer models list | show | promote`, on a local directory and on a stack's bucket (moto)."""

from __future__ import annotations

import json

from trainer.__main__ import main as trainer_main
from trainer.contract.outputs import STACK_OUTPUTS

from .test_registry import BUCKET, REGION, bucket, exported, lineage, runs  # noqa: F401 (fixtures)


def models(capsys, *args: str) -> tuple[int, str, str]:
    code = trainer_main(["models", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_list_promote_and_show_a_local_directory(runs, capsys):  # noqa: F811
    code, out, _ = models(capsys, "list", "--dir", str(runs), "--format", "json")
    listed = json.loads(out)
    assert code == 0 and [v["step"] for v in listed] == [5, 10] and listed[0]["tags"] == []
    newest = listed[1]["version"]
    code, out, _ = models(capsys, "promote", newest, "--tag", "production", "--dir", str(runs))
    assert code == 0 and out.startswith(
        f"production -> {newest}; recorded in {runs}/model-tags/production.json"
    )
    code, out, _ = models(capsys, "show", "production", "--dir", str(runs), "--format", "json")
    shown = json.loads(out)
    assert shown["version"] == newest and shown["tags"] == ["production"]
    assert [e["version"] for e in shown["tag_history"]] == [newest]
    assert shown["metrics"] == {"val_loss": 2.0} and shown["location"].endswith("iter_0000010")
    code, out, _ = models(capsys, "show", "production", "--dir", str(runs))
    assert f"version     {newest}" in out and "tag         production <- " in out
    assert "dataset     " in out and "lineage     sha256 " in out
    code, out, _ = models(capsys, "list", "--dir", str(runs))
    assert newest in out and "production" in out


def test_unknown_names_and_directories_fail_with_one_clear_line(runs, tmp_path, capsys):  # noqa: F811
    code, _, err = models(capsys, "show", "nope", "--dir", str(runs))
    assert code == 2 and err.startswith("models: no model version or tag 'nope' in ")
    code, _, err = models(capsys, "list", "--dir", str(tmp_path / "missing"))
    assert code == 2 and "no such directory" in err
    code, _, err = models(capsys, "list", "--outputs", "x.json", "--dir", str(runs))
    assert code == 2 and "--outputs goes with --stack" in err


def test_list_and_promote_on_a_stack_read_and_write_its_checkpoints_bucket(bucket, runs, tmp_path, capsys):  # noqa: F811
    s3, key = bucket
    exported(s3, runs)
    outputs = {name: f"test-{name}" for name in STACK_OUTPUTS}
    outputs |= {"region": REGION, "checkpoints_bucket": BUCKET, "kms_key_arn": key, "node_count": 2}
    outputs |= {"gpus_per_node": 8}
    outputs_file = tmp_path / "outputs.json"
    outputs_file.write_text(json.dumps(outputs))
    stack = ["--stack", "test", "--outputs", str(outputs_file)]
    code, out, err = models(capsys, "list", *stack, "--format", "json")
    assert code == 0, err
    listed = json.loads(out)
    assert [v["location"] for v in listed] == [
        f"s3://{BUCKET}/tiny/checkpoints/iter_0000005",
        f"s3://{BUCKET}/tiny/checkpoints/iter_0000010",
    ]
    code, out, err = models(
        capsys, "promote", listed[0]["version"], "--tag", "production", *stack, "--format", "json"
    )
    assert code == 0, err
    assert json.loads(out)["written"] == f"s3://{BUCKET}/model-tags/production.json"
    code, out, _ = models(capsys, "show", "production", *stack, "--format", "json")
    assert json.loads(out)["version"] == listed[0]["version"]
