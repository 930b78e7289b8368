"""Distributed training: one step with 2 gloo processes on the CPU (DDP, and FSDP2 where this torch build supports
it) gives the same parameters as one process on the combined batch."""
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from pytransformer.models import DecoderLM, gpt2_small

WORLD = 2


def _model():
    torch.manual_seed(0)
    return DecoderLM(gpt2_small(vocab_size=32, d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=64, max_len=16,
                                dropout=0.0))


def _step(model, ids):
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    loss = F.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    opt.step()


def _batch():
    return torch.randint(0, 32, (4, 10), generator=torch.Generator().manual_seed(1))


def _worker(rank, init_file, out_file, wrapper):
    """One rank's step; rank 0 saves the state. Past the barrier (the state is saved, every rank is done with the
    group) each rank leaves init_file.done<rank>, then tears down and exits without running the interpreter's exit
    handlers, where gloo's threads can abort the process (see the test)."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    model = _model()
    if wrapper == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    else:
        from torch.distributed.fsdp import fully_shard
        for layer in model.decoder.layers:
            fully_shard(layer)
        fully_shard(model)
    _step(model, _batch().chunk(WORLD)[rank])
    state = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in model.state_dict().items()}
    if rank == 0:
        torch.save(state, out_file)
    # No rank tears its gloo group down while the other still uses it (3 aborts in 42 FSDP2 runs without this barrier,
    # none in 60 with it here; it makes aborts rarer but, as one CI run showed, not impossible).
    dist.barrier()
    Path(f"{init_file}.done{rank}").touch()
    dist.destroy_process_group()
    os._exit(0)


@pytest.mark.parametrize("wrapper", ["ddp", "fsdp"])
def test_two_processes_equal_one(wrapper, tmp_path):
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    if wrapper == "fsdp":
        pytest.importorskip("torch.distributed.fsdp", reason="no FSDP in this torch build")
    out = tmp_path / "state.pt"
    for attempt in range(2):
        init = tmp_path / f"init{attempt}"
        try:
            mp.spawn(_worker, args=(str(init), str(out), wrapper), nprocs=WORLD)
            break
        except mp.ProcessRaisedException as e:
            if wrapper == "fsdp" and "fully_shard" in str(e) and "cpu" in str(e).lower():
                pytest.skip(f"FSDP on the CPU is not supported by this torch build: {e}")
            raise
        except mp.ProcessExitedException:
            # gloo on the CPU: a worker still aborts now and then (SIGABRT, "terminate called without an active
            # exception", from a thread of gloo's), seen in clean-clone CI runs with DDP and FSDP2 alike, even with
            # the barrier in _worker. An abort after every rank passed that barrier is in the teardown, after the
            # step and the saved state, which the comparison below still checks; one earlier is retried once.
            if all(Path(f"{init}.done{rank}").exists() for rank in range(WORLD)):
                break
            if attempt == 1:
                raise
    single = _model()
    _step(single, _batch())
    expected = {k.removeprefix("module."): v for k, v in torch.load(out).items()}
    for name, value in single.state_dict().items():
        torch.testing.assert_close(expected[name], value, atol=1e-6, rtol=1e-5, msg=name)
