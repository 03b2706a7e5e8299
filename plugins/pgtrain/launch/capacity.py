"""Can the run's launcher run the job at all? Checked while planning, so an impossible run fails before the
source is scanned and before any rank starts.

``launcher=local``: its ranks run on this worker, which needs a CPU per rank and memory for the model.
``launcher=kubernetes``: the ranks must fill whole worker pods (``world_size`` a multiple of
``gpus_per_worker``); whether the cluster can place them is the scheduler's call, and a job that cannot be
placed fails at its startup timeout.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pgtrain.config.kubernetes import default
from pgtrain.config.params import TrainingConfig
from pgtrain.config.search import SearchLimits, plan_search
from pgtrain.config.settings import AuthorSettings
from pgtrain.core.cpus import usable_cpus
from pgtrain.core.errors import ConfigError
from pgtrain.core.memory import TRAINING_BYTES_PER_PARAMETER, available_bytes
from pgtrain.data.encoding import layout_of
from pgtrain.launch.mpijob.spec import layout


def local_slots() -> int:
    """Ranks this machine runs side by side: its usable CPUs (within its container's CPU limit)."""
    return usable_cpus()


def mlp_parameter_count(input_dim: int, hidden_sizes: tuple[int, ...], output_dim: int) -> int:
    dims = [input_dim, *hidden_sizes, output_dim]
    return sum(fan_in * fan_out + fan_out for fan_in, fan_out in zip(dims, dims[1:], strict=False))


def check_launch(config: TrainingConfig, settings: AuthorSettings) -> None:
    """Refuse a world size the run's launcher cannot lay out, and a search beyond the author's caps (ConfigError
    saying what to choose)."""
    if config.search is not None:
        plan_search(config.search, config.to_dict(), SearchLimits.from_dict(settings.search_limits),
                    settings.allowed_models)
    if config.launcher == "local":
        check_world_size(config)
    else:
        layout(config.world_size, int(settings.kubernetes.get("gpus_per_worker", default("gpus_per_worker"))))


def check_world_size(config: TrainingConfig) -> None:
    slots = local_slots()
    if config.launcher == "local" and config.world_size > slots:
        raise ConfigError(
            f"world_size {config.world_size} is more ranks than this machine's {slots} CPUs can run with "
            f"launcher=local; use world_size <= {slots}, or launcher=kubernetes"
        )


def check_model_size(config: TrainingConfig, input_dim: int, output_dim: int,
                     encoding: Mapping[str, Any] | None = None) -> None:
    """The mlp's training memory on all local ranks must fit in the memory available now. ``encoding``: the run's
    recorded input encoding, whose one-hot categories and quantile bins make the network's first layer wider than
    the input rows (``input_dim``)."""
    if config.launcher != "local" or config.model != "mlp":
        return
    inputs = layout_of(encoding)
    width = input_dim if inputs is None or inputs.width != input_dim else inputs.encoded_width
    parameters = mlp_parameter_count(width, tuple(config.hidden_sizes), output_dim)
    needed = parameters * TRAINING_BYTES_PER_PARAMETER * config.world_size
    available = available_bytes()
    if available and needed > available:
        raise ConfigError(
            f"hidden_sizes {list(config.hidden_sizes)} make an mlp of {parameters:,} parameters; training it on "
            f"{config.world_size} local ranks needs about {_gib(needed)} of memory and this machine has "
            f"{_gib(available)} available; use smaller hidden_sizes or launcher=kubernetes"
        )


def _gib(size: int) -> str:
    return f"{size / 2**30:.1f} GiB" if size >= 2**28 else f"{math.ceil(size / 2**20)} MiB"
