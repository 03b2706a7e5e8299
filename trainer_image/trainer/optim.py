"""How a run steps: its optimizer (AdamW or SGD with momentum), the learning rate at each step (the schedule), and
the optimizer's state in a checkpoint.

The schedule is a pure function of the step number, so a resumed run takes up the same rates where it stopped: a
checkpoint needs only the epoch it was written at, never a scheduler object.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import numpy as np
import torch

from pgtrain.config.params import TrainingConfig
from pgtrain.models.network import writable_tensor

MOMENTUM = 0.9  # sgd
ONE_CYCLE_RISE, ONE_CYCLE_START, ONE_CYCLE_END = 0.3, 25.0, 1e4  # torch's OneCycleLR defaults
OPTIMIZER_PREFIX = "optimizer."  # checkpoint arrays: optimizer.<state key>.<parameter name>


def make_optimizer(config: TrainingConfig, model: torch.nn.Module, learning_rate: float) -> torch.optim.Optimizer:
    """The run's optimizer over the model's trainable parameters, at ``learning_rate`` (the schedule's peak)."""
    parameters = [p for p in model.parameters() if p.requires_grad]
    decay = config.weight_decay_value
    if config.optimizer == "sgd":
        return EAGER_SGD(parameters, lr=learning_rate, momentum=MOMENTUM, weight_decay=decay)
    # foreach=False: the per-parameter loop, whose float arithmetic does not depend on how tensors are grouped.
    return EAGER_ADAMW(parameters, lr=learning_rate, weight_decay=decay, foreach=False)


def eager(base: type[torch.optim.Optimizer]) -> type[torch.optim.Optimizer]:
    """``base`` without torch.compile's guards around its methods, the same arithmetic.

    torch.optim wraps ``step`` in graph breaks and ``zero_grad``, ``add_param_group`` and the state-dict methods
    in ``torch._disable_dynamo``; both import ``torch._dynamo`` on their first call, about 1.7 s of a rank's
    start (issue 32), only to tell a compiler the trainer never runs what not to compile. The subclass calls the
    wrapped methods themselves (``inspect.unwrap``: through every ``functools.wraps``, also the step hooks torch
    puts on a class once it has an instance, which the subclass gets again); where a torch release stops wrapping
    one, the method is used as it is. ``step`` keeps what its wrapper does outside a compiler: gradients off
    (on only for ``differentiable``) while it runs.
    """
    step = inspect.unwrap(base.step)

    def eager_step(self: torch.optim.Optimizer, closure: Any = None) -> Any:
        with torch.set_grad_enabled(self.defaults["differentiable"]):
            return step(self, closure)

    methods = {name: inspect.unwrap(getattr(base, name)) for name in DYNAMO_GUARDED}
    return type(base.__name__, (base,), {**methods, "step": eager_step, "__module__": __name__,
                                         "__doc__": base.__doc__})


DYNAMO_GUARDED = ("zero_grad", "add_param_group", "state_dict", "load_state_dict")
EAGER_SGD, EAGER_ADAMW = eager(torch.optim.SGD), eager(torch.optim.AdamW)


def lr_factor(schedule: str, step: int, total_steps: int, warmup_steps: int) -> float:
    """The learning rate of (0-based) ``step`` of ``total_steps`` as a share of the peak rate."""
    if schedule == "constant":
        return 1.0
    if schedule == "one_cycle":
        rise = max(1, round(ONE_CYCLE_RISE * total_steps))
        low, end = 1.0 / ONE_CYCLE_START, 1.0 / (ONE_CYCLE_START * ONE_CYCLE_END)
        if step < rise:
            return low + (1.0 - low) * _cosine_rise(step / rise)
        return end + (1.0 - end) * (1.0 - _cosine_rise((step - rise) / max(1, total_steps - rise)))
    # cosine: linear warm-up from 0 (its first step at 1/warmup of the rate), then from the peak down to 0
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def _cosine_rise(fraction: float) -> float:
    """0 -> 1 along half a cosine (OneCycleLR's anneal_strategy="cos")."""
    return 0.5 * (1.0 - math.cos(math.pi * min(1.0, fraction)))


def warmup_steps(config: TrainingConfig, steps_per_epoch: int) -> int:
    """Warm-up steps of the cosine schedule: ``warmup_epochs`` of them, at most half of all steps."""
    total = config.epochs * steps_per_epoch
    return min(round(config.warmup_epochs * steps_per_epoch), total // 2)


class Schedule:
    """Sets the optimizer's rate before each step: ``peak * lr_factor(step)``."""

    def __init__(self, config: TrainingConfig, optimizer: torch.optim.Optimizer, peak: float,
                 steps_per_epoch: int) -> None:
        self.optimizer, self.peak, self.schedule = optimizer, peak, config.lr_schedule
        self.total = config.epochs * steps_per_epoch
        self.warmup = warmup_steps(config, steps_per_epoch)

    def set(self, step: int) -> float:
        rate = self.peak * lr_factor(self.schedule, step, self.total, self.warmup)
        for group in self.optimizer.param_groups:
            group["lr"] = rate
        return rate


def optimizer_arrays(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> dict[str, np.ndarray]:
    """The optimizer's per-parameter state (SGD's momentum; AdamW's moments and step) as checkpoint arrays."""
    arrays = {}
    for name, param in model.named_parameters():
        for key, value in optimizer.state.get(param, {}).items():
            if isinstance(value, torch.Tensor):
                arrays[f"{OPTIMIZER_PREFIX}{key}.{name}"] = value.detach().cpu().numpy()
    return arrays


def load_optimizer_arrays(optimizer: torch.optim.Optimizer, model: torch.nn.Module,
                          arrays: dict[str, np.ndarray]) -> None:
    """The state ``optimizer_arrays`` saved, back into ``optimizer`` (every rank loads the same arrays)."""
    by_name = dict(model.named_parameters())
    for key, array in arrays.items():
        state_key, _, name = key.removeprefix(OPTIMIZER_PREFIX).partition(".")
        param = by_name[name]
        value = writable_tensor(array)
        # AdamW keeps its step count on the CPU (capturable=False); the moments live with the parameter.
        optimizer.state[param][state_key] = value if state_key == "step" else value.to(param.device)
