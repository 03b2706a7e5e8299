"""The model a pgtrain run trains: input standardization, a network, and the target's scale.

``build_model(model_ref, input_dim, output_dim, options, seed)`` returns a :class:`PgtrainModel`:

- ``normalizer``: (x - mean) / std with the training rows' statistics (buffers); for input rows with
  categorical codes (``pgtrain.data.encoding``) an :class:`Encode`, which standardizes the numeric inputs and
  one-hot encodes each category, so that the network (a user's too) receives float columns only,
- ``net``: the built-in MLP (``model_ref="mlp"``, options ``{"hidden_sizes": [...]}``) or the module a
  user's factory returns (``model_ref="package.module:factory"``, called as
  ``factory(input_dim=..., output_dim=..., **options)``),
- ``target``: z * std + mean (buffers) so that ``forward`` predicts in the target's units; identity
  (mean 0, std 1) for classification, whose outputs are logits.

Every tensor a version needs lives in the state dict, so a version is usable alone.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pgtrain.config.boosted import BOOSTED
from pgtrain.config.params import CLAMP_TARGET, NORMALIZATIONS
from pgtrain.core.errors import ConfigError
from pgtrain.core.memory import available_bytes
from pgtrain.data.encoding import Layout, layout_of
from pgtrain.models.ensemble import EnsembleMLP
from pgtrain.models.layers import hidden_layers
from pgtrain.models.piecewise import PiecewiseLinear
from pgtrain.models.spec import BUILTIN_MLP


class _Scale(nn.Module):
    """A mean and a std per feature, kept in the state dict so a version is usable alone."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("std", torch.ones(dim))


class Standardize(_Scale):
    """(x - mean) / std with statistics of the training rows."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


class Encode(_Scale):
    """An input row of ``numeric`` values then one code per category (``sizes`` codes each) -> the standardized
    values (those with quantile ``edges``: piecewise-linear encoded, ``pgtrain.models.piecewise``), then each
    category one-hot. One-hot rather than a learned embedding: the first Linear layer over a one-hot block *is* an
    embedding (its weight column for a code is that code's vector), with max_categories bounding the width."""

    def __init__(self, numeric: int, sizes: Sequence[int], edges: Sequence[Sequence[float]] = ()) -> None:
        super().__init__(numeric)
        self.numeric, self.sizes = numeric, tuple(sizes)
        starts = torch.tensor([0, *sizes[:-1]], dtype=torch.long).cumsum(0)
        self.register_buffer("starts", starts, persistent=False)  # derived from the layout: not in the state dict
        self.piecewise = PiecewiseLinear(edges, numeric) if any(edges) else None

    @property
    def width(self) -> int:
        return self.dense_width + sum(self.sizes)

    @property
    def dense_width(self) -> int:
        """Columns of ``dense``'s output."""
        return self.piecewise.width_out if self.piecewise is not None else self.numeric

    def dense(self, x: torch.Tensor) -> torch.Tensor:
        """The numeric part of the encoded input (the categories' one-hot codes follow it)."""
        raw = x[:, :self.numeric]
        values = (raw - self.mean) / self.std
        return values if self.piecewise is None else self.piecewise(raw, values)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dense = self.dense(x)
        if not self.sizes:
            return dense
        codes = x[:, self.numeric:].long() + self.starts
        one_hot = x.new_zeros(len(x), sum(self.sizes)).scatter_(1, codes, 1.0)
        return torch.cat([dense, one_hot], 1)


class Unstandardize(_Scale):
    """z * std + mean: from the network's standardized output back to the target's units."""

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z * self.std + self.mean

    def scale(self, y: torch.Tensor) -> torch.Tensor:
        """The inverse: a target in its units -> the standardized scale the network is trained on (where ``y`` is:
        targets kept in host memory are scaled there)."""
        return (y - self.mean.to(y.device)) / self.std.to(y.device)


class ClampedUnstandardize(Unstandardize):
    """Unstandardize, and outside training the result kept within the training targets' range (``low``..``high``
    per output, buffers the trainer fills): a network extrapolates without bound, the targets it learnt from do
    not."""

    def __init__(self, dim: int) -> None:
        super().__init__(dim)
        self.register_buffer("low", torch.full((dim,), -torch.inf))
        self.register_buffer("high", torch.full((dim,), torch.inf))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        out = super().forward(z)
        return out if self.training else torch.minimum(torch.maximum(out, self.low), self.high)

    def clamp_standardized(self, z: torch.Tensor) -> torch.Tensor:
        """The same bounds on the standardized scale (what the validation and test figures are read on)."""
        return z if self.training else torch.minimum(torch.maximum(z, self.scale(self.low)), self.scale(self.high))


class PgtrainModel(nn.Module):
    def __init__(self, net: nn.Module, input_dim: int, output_dim: int, layout: Layout | None = None,
                 clamp_target: bool = False) -> None:
        super().__init__()
        self.input_dim = input_dim
        self.output_dim = output_dim
        encoded = layout is not None and bool(layout.sizes or layout.edges)
        self.normalizer = Encode(layout.numeric, layout.sizes, layout.edges) if encoded else Standardize(input_dim)
        self.net = net
        self.target = ClampedUnstandardize(output_dim) if clamp_target else Unstandardize(output_dim)

    @property
    def standardized_columns(self) -> int:
        """The input row's leading columns the normalizer standardizes (the rest are category codes)."""
        return len(self.normalizer.mean)

    def standardized(self, x: torch.Tensor) -> torch.Tensor:
        """The network's output before ``target``: what the loss is computed on (outside training, clamped where
        ``target`` clamps)."""
        out = self._standardized(x)
        return self.target.clamp_standardized(out) if isinstance(self.target, ClampedUnstandardize) else out

    def _standardized(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(self.normalizer, Encode) and self.normalizer.sizes and isinstance(
                self.net, nn.Sequential) and isinstance(self.net[0], nn.Linear):
            return self._sparse_first_layer(x)
        return self.net(self.normalizer(x))

    def _sparse_first_layer(self, x: torch.Tensor) -> torch.Tensor:
        """``net(normalizer(x))`` without building the one-hot block: a Linear over one-hot codes is the sum of
        the weight columns of the codes present, one ``embedding_bag`` (the same parameters, the same result up
        to the order of a sum; a tenth of the time with 5 categories of 100 levels)."""
        encode, first = self.normalizer, self.net[0]
        n, d = encode.numeric, encode.dense_width
        codes = x[:, n:].long() + encode.starts
        h = F.linear(encode.dense(x), first.weight[:, :d], first.bias) + F.embedding_bag(
            codes, first.weight[:, d:].t(), mode="sum")
        for layer in list(self.net)[1:]:
            h = layer(h)
        return h

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.target(self.standardized(x))


def mlp(input_dim: int, output_dim: int, hidden_sizes: Sequence[int] = (50,), dropout: float = 0.0,
        normalization: str = "none", members: int = 1, average: str = "values") -> nn.Module:
    """Hidden layers of Linear (then LayerNorm with ``normalization="layer"``), ReLU (then Dropout when ``dropout``),
    and a Linear output layer; with ``members`` > 1 a shared-weight ensemble of that many such networks
    (``pgtrain.models.ensemble``, averaging its members' ``average``). The defaults are the layout of versions made
    before these options existed, which load with them (their spec records hidden_sizes only)."""
    if normalization not in NORMALIZATIONS:
        raise ConfigError(f"mlp: normalization={normalization!r} should be one of {', '.join(NORMALIZATIONS)}")
    if members > 1:
        return EnsembleMLP(input_dim, output_dim, hidden_sizes, members, dropout, normalization, average)
    layers, fan_in = hidden_layers(input_dim, hidden_sizes, lambda fan_in, width, _: nn.Linear(fan_in, width),
                                   normalization, dropout)
    return nn.Sequential(*layers, nn.Linear(fan_in, output_dim))


def resolve_factory(model_ref: str) -> Callable[..., nn.Module]:
    """``"mlp"`` or ``"package.module:factory"`` -> the callable; ConfigError naming the path if it cannot be had."""
    if model_ref == BUILTIN_MLP:
        return mlp
    module_name, colon, attribute = model_ref.partition(":")
    if not colon or not module_name or not attribute:
        raise ConfigError(f"model {model_ref!r} should be 'mlp' or 'package.module:factory'")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # ImportError, or whatever the module raises while importing
        raise ConfigError(f"model {model_ref!r}: cannot import {module_name!r} ({type(error).__name__}: {error}); "
                          "install it in the trainer image or fix the model param") from error
    factory = module
    for part in attribute.split("."):
        factory = getattr(factory, part, None)
        if factory is None:
            raise ConfigError(f"model {model_ref!r}: module {module_name!r} has no attribute {attribute!r}")
    if not callable(factory):
        raise ConfigError(f"model {model_ref!r}: {attribute!r} is not callable")
    return factory


def build_model(model_ref: str, input_dim: int, output_dim: int, options: Mapping[str, Any] | None,
                seed: int, encoding: Mapping[str, Any] | None = None, task: str | None = None) -> PgtrainModel:
    """The model of a run or version, initialized from ``seed``; ConfigError if the factory does not deliver.

    ``encoding`` (``pgtrain.data.encoding``): input rows with categorical codes are one-hot encoded before the
    network, which is built for (and the factory called with) the encoded width. ``model_ref="xgboost"``: the
    boosted built-in (``pgtrain.models.booster``), for ``task``.

    The factory's module is probed with a forward pass on a batch of 2 zero rows: it must return
    ``(2, output_dim)``.
    A model larger than the memory this process can still use is refused before it is allocated (a
    container over its limit is killed, not told): a refusal, which no retry would cure.
    """
    if model_ref == BOOSTED:  # trees, not a network: no factory, no probe (pgtrain.models.booster)
        from pgtrain.models import booster

        return booster.build(input_dim, output_dim, options, encoding, task)
    factory = resolve_factory(model_ref)
    options = dict(options or {})
    # the built-in's own option, of the wrapper rather than the network
    clamp_target = bool(options.pop(CLAMP_TARGET, False)) if model_ref == BUILTIN_MLP else False
    layout = layout_of(encoding)
    if layout is not None and model_ref != BUILTIN_MLP:  # quantile bins are the built-in mlp's input encoding
        layout = layout.standardized()
    if layout is not None and layout.width != input_dim:
        raise ConfigError(f"the encoding has input rows of {layout.width} columns, the model {input_dim}")
    net_input = layout.encoded_width if layout is not None else input_dim
    size = planned_size(factory, net_input, output_dim, options)
    available = available_bytes()
    if size is not None and available is not None and size[1] > available:
        raise ConfigError(_too_large(model_ref, size, f"this trainer has {_gib(available)} of memory available"))
    torch.manual_seed(seed)
    try:
        net = factory(input_dim=net_input, output_dim=output_dim, **dict(options or {}))
    except Exception as error:
        if _out_of_memory(error):
            raise ConfigError(_too_large(model_ref, size, f"allocating it failed ({type(error).__name__})")) from error
        raise ConfigError(f"model {model_ref!r}: the factory raised {type(error).__name__}: {error} "
                          f"(called with input_dim={net_input}, output_dim={output_dim}, options "
                          f"{dict(options or {})})") from error
    if not isinstance(net, nn.Module):
        raise ConfigError(f"model {model_ref!r}: the factory returned {type(net).__name__}, not a torch.nn.Module")
    model = PgtrainModel(net, input_dim, output_dim, layout, clamp_target)
    _probe(model, model_ref)
    return model


def planned_size(factory: Callable[..., nn.Module], input_dim: int, output_dim: int,
                 options: Mapping[str, Any] | None) -> tuple[int, int] | None:
    """(parameters, bytes of the state dict) of the factory's module, built on the meta device (no memory).

    None when the factory cannot build there (it reads data, say): the real build reports its own errors.
    """
    try:
        with torch.device("meta"):
            net = factory(input_dim=input_dim, output_dim=output_dim, **dict(options or {}))
    except Exception:
        return None
    if not isinstance(net, nn.Module):
        return None
    parameters = sum(p.numel() for p in net.parameters())
    # The wrapper's buffers: normalizer and target mean/std, float32.
    nbytes = sum(t.numel() * t.element_size() for t in net.state_dict().values()) + 8 * (input_dim + output_dim)
    return parameters, nbytes


def _out_of_memory(error: BaseException) -> bool:
    text = str(error).lower()
    return (isinstance(error, (MemoryError, torch.OutOfMemoryError))
            or (isinstance(error, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text)))


def _too_large(model_ref: str, size: tuple[int, int] | None, why: str) -> str:
    what = "of unknown size" if size is None else f"with {size[0]:,} parameters ({_gib(size[1])})"
    return (f"model {model_ref!r} {what} cannot be allocated: {why}; make it smaller (hidden_sizes or "
            "model_options) or give the trainer more memory (worker_memory on Kubernetes)")


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:,.1f} GiB"


def _probe(model: PgtrainModel, model_ref: str) -> None:
    # eval mode: a probe must not move BatchNorm running statistics or draw dropout masks.
    model.eval()
    try:
        with torch.no_grad():
            out = model.standardized(torch.zeros(2, model.input_dim))
    except Exception as error:
        raise ConfigError(f"model {model_ref!r}: a forward pass on a (2, {model.input_dim}) batch raised "
                          f"{type(error).__name__}: {error}") from error
    finally:
        model.train()
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, model.output_dim):
        got = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ConfigError(f"model {model_ref!r}: a (2, {model.input_dim}) batch gives output {got}, the run "
                          f"needs [2, {model.output_dim}] (output_dim={model.output_dim})")
    if out.dtype != torch.float32:
        raise ConfigError(f"model {model_ref!r}: the output is {out.dtype}, the run needs torch.float32")


def writable_tensor(array: Any) -> torch.Tensor:
    """A stored array (a read-only little-endian view) as a tensor of its own native-order memory."""
    return torch.from_numpy(np.array(array, dtype=array.dtype.newbyteorder("=")))


def state_layout(model: nn.Module) -> dict[str, dict[str, Any]]:
    """name -> {"shape": [...], "dtype": "float32"} of the whole state dict (runs.set_model_layout)."""
    return {name: {"shape": list(t.shape), "dtype": _dtype_name(t)}
            for name, t in model.state_dict().items()}


def layout_problems(model: nn.Module, arrays: Mapping[str, Any]) -> list[str]:
    """What keeps ``arrays`` (name -> array) from loading into ``model``: missing, unexpected, wrong shape."""
    state = model.state_dict()
    problems = [f"missing {name} {list(t.shape)}" for name, t in state.items() if name not in arrays]
    problems += [f"unexpected {name}" for name in arrays if name not in state]
    problems += [f"{name} has shape {list(arrays[name].shape)}, the model has {list(t.shape)}"
                 for name, t in state.items() if name in arrays and tuple(arrays[name].shape) != tuple(t.shape)]
    problems += [f"{name} is {arrays[name].dtype}, the model has {_dtype_name(t)}"
                 for name, t in state.items() if name in arrays and str(arrays[name].dtype) != _dtype_name(t)]
    return problems


def _dtype_name(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")
