"""In-process megatron-core for the model tests: a one-process gloo world with megatron's model-parallel state."""

import pytest
import torch
from megatron.core import parallel_state, tensor_parallel

from trainer.distributed import megatron_compat


# Per module: other test files start (and end) their own default process group.
@pytest.fixture(scope="module")
def model_parallel(tmp_path_factory):
    """A one-process gloo world with megatron's model-parallel state, as parallel.initialize starts it."""
    megatron_compat.apply()
    store = tmp_path_factory.mktemp("rendezvous") / "store"
    torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    tensor_parallel.model_parallel_cuda_manual_seed(7)
    yield
    parallel_state.destroy_model_parallel()
    torch.distributed.destroy_process_group()
