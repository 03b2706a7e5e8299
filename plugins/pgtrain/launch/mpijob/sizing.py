"""How large a worker pod is by default: its host CPUs and memory sized per GPU it holds, and one worker per node for
workers that take a whole GPU node. Pure Python."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from pgtrain.core.errors import ConfigError

# A worker holding this many GPUs takes a whole node of the usual GPU servers (8 GPUs each): one worker per node,
# so that two of a job's workers never share a node's NICs and host memory, on nodes with more GPUs too.
WHOLE_NODE_GPUS = 8
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")


def scale_quantity(quantity: str, times: int) -> str:
    """A Kubernetes quantity (``4``, ``500m``, ``16Gi``) ``times`` over, in the same unit."""
    match = _QUANTITY.match(str(quantity).strip())
    if not match:
        raise ConfigError(f"{quantity!r} is not a Kubernetes quantity pgtrain can size per GPU (write it as a number "
                          "with an optional unit: 4, 500m, 16Gi)")
    try:
        number = Decimal(match.group(1)) * times
    except InvalidOperation:  # pragma: no cover - the pattern admits only decimals
        raise ConfigError(f"{quantity!r} is not a number") from None
    text = format(number.normalize(), "f")
    return text + (match.group(2) or "")


def per_gpu(explicit: str | None, each: str, gpus: int) -> str:
    """A worker's request: the author's ``explicit`` one, else ``each`` for each of its ``gpus``."""
    return explicit if explicit is not None else scale_quantity(each, gpus)


def one_worker_per_node(explicit: bool | None, gpus: int) -> bool:
    """The author's choice, else on for whole-node workers (WHOLE_NODE_GPUS GPUs or more)."""
    return explicit if explicit is not None else gpus >= WHOLE_NODE_GPUS
