"""Issue 13, defect 13: a checkpoint of the local layer spec (CPU) loads where the model carries Transformer
Engine style `_extra_state` (the GPU spec), and the reverse; only `_extra_state` may be absent. Verified on CPU
by giving the local model's attention modules an extra state as TE's have (tests/support/extra_state_worker.py)."""

import json
import os
import subprocess

import pytest

from tests.conftest import ROOT
from tests.support.training import torchrun


@pytest.mark.slow
def test_checkpoints_load_across_layer_specs_and_only_extra_state_may_be_absent(tmp_path):
    done = subprocess.run(
        torchrun(1, "tests.support.extra_state_worker", str(tmp_path)),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["default strict load, local checkpoint into TE-style model"].startswith(
        "RuntimeError: Error(s) in loading state_dict"
    )  # what the trainer did before: refused
    assert results["local checkpoint into TE-style model"] == "loaded"
    assert results["weights equal after local -> TE-style"] is True
    assert results["TE-style checkpoint into local model"] == "loaded"
    assert results["weights equal after TE-style -> local"] is True
    assert results["checkpoint lacking the output layer"].startswith(
        f"CheckpointError: checkpoint '{tmp_path / 'local' / 'iter_0000000'}' lacks 1 entries this model needs, "
        "e.g. output_layer.weight"
    )
