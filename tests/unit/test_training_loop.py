"""The training loop without Horovod: the batches it steps on, and the auto batch size and learning rate."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from pgtrain.config.params import TrainingConfig
from pgtrain.models.network import PgtrainModel
from trainer.evaluate import Task
from trainer.optim import MOMENTUM, Schedule, make_optimizer
from trainer.train import (
    Batches,
    batch_bounds,
    epoch_batches,
    epoch_order,
    train_epoch,
)


class RecordingNet(nn.Module):
    """Logits from a linear layer; remembers the rows (feature 0 = the row's position) of every batch."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(1, 2)
        self.batches: list[list[int]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.batches.append([int(v) for v in x[:, 0]])
        return self.linear(x)


@pytest.mark.parametrize("train_count, steps", [(103, 10), (64, 64), (5, 8)])
def test_an_epoch_steps_on_the_reference_batches_and_each_row_once(train_count, steps):
    """The loop gathers each batch with index_select into reused buffers: exactly the batches the reference
    (epoch_batches) replays, every training row once per epoch; a rank with fewer rows than steps takes
    part in the remaining steps with empty batches (one backward each, no rows)."""
    net = RecordingNet()
    model = PgtrainModel(net, 1, 2)
    x_train = torch.arange(train_count, dtype=torch.float32).reshape(-1, 1)
    y_train = torch.arange(train_count) % 2
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    seed, epoch, rank = 3, 2, 1
    order = torch.from_numpy(epoch_order(train_count, seed, epoch, rank))
    largest = -(-train_count // steps)
    batches = Batches(x_train, y_train, largest, torch.device("cpu"))
    assert not batches.staged  # the rows are where the model is: gathered in place, nothing copied over
    schedule = Schedule(TrainingConfig(epochs=epoch, lr_schedule="constant"), optimizer, 0.01, steps)
    sums = train_epoch(model, optimizer, schedule, (epoch - 1) * steps, Task(False, 2, torch.device("cpu")), batches,
                       order, batch_bounds(train_count, steps))

    reference = [b.tolist() for b in epoch_batches(np.arange(train_count), steps, seed, epoch, rank)]
    taken = [b for b in net.batches if not (len(b) == 2 and b == [0, 0])]  # the empty steps' zero probe
    assert taken == [b for b in reference if b]
    assert len(net.batches) == steps
    assert sorted(r for b in taken for r in b) == list(range(train_count))
    assert 0 <= float(sums[1]) <= train_count


@pytest.mark.parametrize("train_count", [0, 1, 997, 50_000])
def test_an_epoch_order_is_the_seeded_permutation_in_four_byte_positions(train_count):
    """Half the bytes of numpy's int64 permutation, and the same order: a run resumed from a checkpoint written
    before repeats its epochs."""
    order = epoch_order(train_count, 7, 3, 1)
    assert order.dtype == np.int32
    np.testing.assert_array_equal(order, np.random.default_rng([7, 3, 1]).permutation(train_count))


def test_the_auto_batch_size_and_learning_rate():
    auto = TrainingConfig(world_size=2, optimizer="sgd")
    assert (auto.batch_size, auto.learning_rate) == (None, None)
    assert auto.batch_size_for(804) == 32  # the digits of `make demo`: as before
    assert auto.learning_rate_for(32) == pytest.approx(0.05)
    assert auto.batch_size_for(10) == 32
    assert auto.batch_size_for(10_000) == 200
    assert auto.learning_rate_for(200) == pytest.approx(0.05 * 400 / 64)
    assert auto.batch_size_for(90_000) == 1800
    assert auto.batch_size_for(10_000_000) == 2048
    assert auto.learning_rate_for(512) == pytest.approx(0.8)
    assert auto.learning_rate_for(2048) == pytest.approx(0.8)  # capped
    assert TrainingConfig(world_size=1, optimizer="sgd").learning_rate_for(512) == pytest.approx(0.4)
    # AdamW (the default): 0.008 at a global batch of 64, with the square root of the batch, at most 0.01
    adamw = TrainingConfig(world_size=2)
    assert adamw.learning_rate_for(32) == pytest.approx(0.008)
    assert TrainingConfig(world_size=1).learning_rate_for(16) == pytest.approx(0.008 * (16 / 64) ** 0.5)
    assert adamw.learning_rate_for(50) == pytest.approx(0.01)  # 0.008 x sqrt(100 / 64), capped
    assert TrainingConfig(world_size=64).learning_rate_for(2048) == pytest.approx(0.01)  # capped
    assert (adamw.weight_decay_value, auto.weight_decay_value, TrainingConfig(weight_decay=0.1).weight_decay_value) \
        == (0.01, 0.0, 0.1)
    explicit = TrainingConfig(world_size=2, batch_size=16, learning_rate=0.3)
    assert (explicit.batch_size_for(90_000), explicit.learning_rate_for(16)) == (16, 0.3)
    assert TrainingConfig.from_mapping({"batch_size": None, "learning_rate": None}).batch_size is None


@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_the_trainer_s_optimizers_step_exactly_as_torch_s_own(name):
    """trainer.optim.eager skips only torch.compile's guards (which import torch._dynamo): the same arithmetic."""
    config = TrainingConfig(optimizer=name, weight_decay=0.01)
    models = [nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3)) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    initial = models[0][0].weight.detach().clone()
    ours = make_optimizer(config, models[0], 0.05)
    kwargs = {"momentum": MOMENTUM} if name == "sgd" else {"foreach": False}
    theirs = getattr(torch.optim, "SGD" if name == "sgd" else "AdamW")(models[1].parameters(), lr=0.05,
                                                                        weight_decay=0.01, **kwargs)
    assert isinstance(ours, type(theirs)) and type(ours) is not type(theirs)
    x, y = torch.randn(32, 6, generator=torch.Generator().manual_seed(0)), torch.arange(32) % 3
    for _ in range(5):
        for model, optimizer in zip(models, (ours, theirs), strict=True):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            assert all(p.grad is not None and not p.grad.requires_grad for p in model.parameters())
    for mine, reference in zip(models[0].parameters(), models[1].parameters(), strict=True):
        assert torch.equal(mine, reference)
    assert (models[0][0].weight - initial).abs().max() > 1e-3  # they did step
    # its state dict loads into torch's own optimizer and back
    theirs.load_state_dict(ours.state_dict())
    ours.load_state_dict(theirs.state_dict())
    assert ours.state_dict()["param_groups"] == theirs.state_dict()["param_groups"]


class DtypeRecordingNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(1, 2)
        self.dtypes: list[torch.dtype] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.linear(x)
        self.dtypes.append(out.dtype)
        return out


@pytest.mark.parametrize(("precision", "dtype"), [("bf16", torch.bfloat16), ("fp32", torch.float32)])
def test_the_run_s_precision_sets_the_training_steps_forward_dtype(precision, dtype):
    """precision: bf16 (the author's) autocasts each step's forward pass; weights and gradients stay float32."""
    net = DtypeRecordingNet()
    model = PgtrainModel(net, 1, 2)
    x_train, y_train = torch.arange(32, dtype=torch.float32).reshape(-1, 1), torch.arange(32) % 2
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = Batches(x_train, y_train, 8, torch.device("cpu"))
    schedule = Schedule(TrainingConfig(epochs=1, lr_schedule="constant"), optimizer, 0.01, 4)
    sums = train_epoch(model, optimizer, schedule, 0, Task(False, 2, torch.device("cpu")), batches,
                       torch.from_numpy(epoch_order(32, 0, 1, 0)), batch_bounds(32, 4), precision)
    assert net.dtypes == [dtype] * 4
    assert net.linear.weight.dtype == net.linear.weight.grad.dtype == torch.float32
    assert torch.isfinite(sums).all()
