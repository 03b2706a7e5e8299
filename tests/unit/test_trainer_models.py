"""Model building: the built-in MLP, factories named by import path, and the refusals of bad ones.
(The same in real ranks: tests/integration/horovod/test_trainer_models_ranks.py.)"""

from __future__ import annotations

import resource
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from torch import nn

from pgtrain.core.errors import ConfigError
from pgtrain.core.memory import available_bytes
from pgtrain.models.network import PgtrainModel, build_model, planned_size, resolve_factory, state_layout
from pgtrain.runs import record
from trainer.train import steps_per_epoch

RESMLP = "trainer.examples.resmlp:residual_mlp"


# Factories for the refusal tests: ranks import them by path, as they would a user's package
# (tests/integration/horovod/test_trainer_models_ranks.py).
def wrong_width(input_dim: int, output_dim: int) -> nn.Module:
    return nn.Linear(input_dim, output_dim + 1)


def raising(input_dim: int, output_dim: int) -> nn.Module:
    raise RuntimeError("no weights for you")


NOT_A_FACTORY = 3


def fits_only_on_meta(input_dim: int, output_dim: int) -> nn.Module:
    """Sized on the meta device, then out of memory when allocated for real."""
    net = nn.Linear(input_dim, output_dim)
    if net.weight.device.type != "meta":
        raise MemoryError()
    return net


def allocator_fails(input_dim: int, output_dim: int) -> nn.Module:
    raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: "
                       "you tried to allocate 17179869184 bytes. Error code 12 (Cannot allocate memory)")


def test_the_mlp_is_wrapped_with_normalizer_and_target_scale():
    model = build_model("mlp", 4, 3, {"hidden_sizes": [5]}, seed=0)
    assert isinstance(model, PgtrainModel) and isinstance(model.net, nn.Sequential)
    assert state_layout(model) == {
        "normalizer.mean": {"shape": [4], "dtype": "float32"}, "normalizer.std": {"shape": [4], "dtype": "float32"},
        "net.0.weight": {"shape": [5, 4], "dtype": "float32"}, "net.0.bias": {"shape": [5], "dtype": "float32"},
        "net.2.weight": {"shape": [3, 5], "dtype": "float32"}, "net.2.bias": {"shape": [3], "dtype": "float32"},
        "target.mean": {"shape": [3], "dtype": "float32"}, "target.std": {"shape": [3], "dtype": "float32"}}
    model.normalizer.mean.fill_(1.0)
    model.normalizer.std.fill_(2.0)
    model.target.mean.copy_(torch.tensor([10.0, 20.0, 30.0]))
    model.target.std.fill_(4.0)
    x = torch.randn(7, 4)
    with torch.no_grad():
        assert torch.allclose(model(x), model.net((x - 1.0) / 2.0) * 4.0 + torch.tensor([10.0, 20.0, 30.0]))
    # Same seed, same weights: every rank builds the same model before the broadcast.
    again = build_model("mlp", 4, 3, {"hidden_sizes": [5]}, seed=0)
    assert torch.equal(again.net[0].weight, model.net[0].weight)


def test_a_factory_gets_the_widths_and_its_options():
    model = build_model(RESMLP, 6, 2, {"width": 8, "blocks": 3}, seed=1)
    assert len(model.net.blocks) == 3 and model.net.stem.out_features == 8
    assert model(torch.zeros(5, 6)).shape == (5, 2)
    assert resolve_factory("mlp").__name__ == "mlp"


@pytest.mark.parametrize(("ref", "options", "message"), [
    ("no_such_package.models:net", {}, "model 'no_such_package.models:net': cannot import 'no_such_package.models'"),
    ("trainer.examples.resmlp:nothing_here", {}, "has no attribute 'nothing_here'"),
    ("trainer.examples.resmlp", {}, "should be 'mlp' or 'package.module:factory'"),
    (f"{__name__}:NOT_A_FACTORY", {}, "'NOT_A_FACTORY' is not callable"),
    (f"{__name__}:raising", {}, "the factory raised RuntimeError: no weights for you"),
    (RESMLP, {"blocks": 0}, "the factory raised ValueError: width=64 and blocks=0 should both be >= 1"),
    (RESMLP, {"depth": 2}, "the factory raised TypeError"),
    (f"{__name__}:wrong_width", {}, "a (2, 4) batch gives output [2, 4], the run needs [2, 3] (output_dim=3)"),
])
def test_bad_models_are_refused_with_the_path(ref, options, message):
    with pytest.raises(ConfigError) as refused:
        build_model(ref, 4, 3, options, seed=0)
    assert message in str(refused.value)
    assert repr(ref) in str(refused.value)


@pytest.mark.parametrize(("ref", "what", "why"), [
    (f"{__name__}:fits_only_on_meta", "with 15 parameters (0.0 GiB)", "allocating it failed (MemoryError)"),
    (f"{__name__}:allocator_fails", "of unknown size", "allocating it failed (RuntimeError)"),
])
def test_a_model_that_cannot_be_allocated_is_refused(ref, what, why):
    with pytest.raises(ConfigError) as refused:
        build_model(ref, 4, 3, {}, seed=0)
    assert str(refused.value) == (
        f"model {ref!r} {what} cannot be allocated: {why}; make it smaller (hidden_sizes or model_options) "
        "or give the trainer more memory (worker_memory on Kubernetes)")


@contextmanager
def address_space_capped(extra_bytes: int) -> Iterator[None]:
    """A safety net: should the size check not refuse, allocation fails at once instead of eating the RAM."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    status = Path("/proc/self/status").read_text()
    used = int(next(line for line in status.splitlines() if line.startswith("VmSize:")).split()[1]) * 1024
    cap = used + extra_bytes if hard == resource.RLIM_INFINITY else min(hard, used + extra_bytes)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def test_a_model_larger_than_the_memory_is_refused_before_it_is_allocated():
    hidden = 2**36  # 10 -> 2**36 -> 2: 13 * 2**36 + 2 parameters, 3.25 TiB of float32
    assert planned_size(resolve_factory("mlp"), 10, 2, {"hidden_sizes": [hidden]}) == (
        13 * hidden + 2, 4 * (13 * hidden + 2) + 8 * 12)
    with address_space_capped(2**30), pytest.raises(ConfigError) as refused:
        build_model("mlp", 10, 2, {"hidden_sizes": [hidden]}, seed=0)
    message = str(refused.value)
    assert message.startswith("model 'mlp' with 893,353,197,570 parameters (3,328.0 GiB) cannot be allocated: ")
    assert "of memory available" in message and "\n" not in message


def test_planned_size_matches_the_built_model():
    model = build_model(RESMLP, 6, 2, {"width": 8, "blocks": 3}, seed=1)
    parameters = sum(p.numel() for p in model.parameters())
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    assert planned_size(resolve_factory(RESMLP), 6, 2, {"width": 8, "blocks": 3}) == (parameters, nbytes)
    assert 0 < available_bytes()


def test_steps_per_epoch_comes_from_the_largest_shard():
    shards = [record.Shard(0, 2, "1", "5", 10, 9, 1), record.Shard(1, 2, "6", "9", 10, 7, 3)]
    assert steps_per_epoch(shards, 4) == 3


def test_the_epoch_line_says_progress_metric_speed_and_eta():
    from trainer.train import epoch_line

    line = epoch_line(3, 10, {"train_loss": 0.5, "val_rmse": 1.25, "val_mae": 1.0, "val_r2": 0.8,
                              "samples_per_second": 1234.4, "seconds": 2.0}, steps=7, regression=True)
    assert line == ("epoch 3/10: train loss 0.5000, val rmse 1.2500 mae 1.0000 r2 0.8000, 7 steps, "
                    "1234 samples/s, 2.00s, ETA 14s")


def test_the_sparse_first_layer_equals_one_hot_then_linear_in_output_and_gradients():
    """With categories, the built-in mlp's first layer sums weight columns (embedding_bag) instead of multiplying
    a one-hot block: the same function of the same parameters."""
    import torch

    from pgtrain.models.network import build_model

    encoding = {"columns": [
        {"name": "x", "type": "real", "kind": "number", "mean": 0.0, "missing": True},
        {"name": "city", "type": "text", "kind": "category", "levels": ["a", "b", "c"], "hashes": [1, 2, 3]},
        {"name": "day", "type": "date", "kind": "date", "mean": 5.0, "missing": False},
        {"name": "size", "type": "text", "kind": "category", "levels": ["s"], "hashes": [4]}]}
    model = build_model("mlp", 5, 3, {"hidden_sizes": [7]}, seed=1, encoding=encoding)
    with torch.no_grad():
        model.normalizer.mean.copy_(torch.tensor([1.0, 0.5, 3.0]))
        model.normalizer.std.copy_(torch.tensor([2.0, 0.5, 4.0]))
    x = torch.tensor([[1.5, 0.0, 2.0, 4.0, 0.0], [-2.0, 1.0, 9.0, 1.0, 2.0], [0.0, 0.0, 3.0, 0.0, 1.0]])
    sparse = model.standardized(x)
    sparse.square().sum().backward()
    sparse_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    dense = model.net(model.normalizer(x))  # one-hot block, then the Linear
    dense.square().sum().backward()
    assert model.normalizer(x).shape == (3, 3 + 5 + 3)
    torch.testing.assert_close(sparse, dense)
    for got, want in zip(sparse_grads, [p.grad for p in model.parameters()], strict=True):
        torch.testing.assert_close(got, want)
