"""The gradient-boosted built-in's model (``model: xgboost``): a booster behind the MLP model's interface, so that
``load_model``, ``load_predictor`` and ``predict`` score a boosted version unchanged. Training is trainer.boosted.

The version holds one tensor, ``booster``: the booster's UBJSON bytes as uint8. Category codes of the encoding are
XGBoost categories (``categorical: native``); a numeric NULL is missing (the encoding's "was missing" input says
where: the imputed mean is put back to NaN).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from pgtrain.config.boosted import BOOSTED
from pgtrain.config.metrics import REGRESSION
from pgtrain.core.errors import ConfigError, PgtrainError
from pgtrain.data import encoding as encodings

BOOSTER = "booster"  # the one tensor of a boosted version


def xgboost_module() -> Any:
    try:
        import xgboost
    except ImportError as error:
        raise ConfigError(f"model {BOOSTED!r} needs the xgboost package in the trainer's environment (pip install "
                          "'pgtrain[boosted]' with constraints.txt; the trainer images have it)") from error
    return xgboost


class BoostedModel(nn.Module):
    """A booster behind the MLP model's interface: ``forward`` takes input rows (float32, the encoding's layout)
    and returns regression values, or class logits (margins; two classes as [0, margin]) whose softmax is the
    booster's probabilities. Its state dict is ``{"booster": uint8 bytes}`` of any length."""

    def __init__(self, input_dim: int, output_dim: int, options: Mapping[str, Any],
                 encoding: Mapping[str, Any] | None, regression: bool) -> None:
        super().__init__()
        self.input_dim, self.output_dim, self.regression = input_dim, output_dim, regression
        self.options = dict(options)
        self.register_buffer(BOOSTER, torch.zeros(0, dtype=torch.uint8))
        self.target = nn.Identity()  # trees predict in the target's units: nothing to undo
        columns = encodings.columns_of(encoding or {})
        parts = encodings.inputs(columns)
        position = {(part, column.name): i for i, (part, column) in enumerate(parts)}
        # (value position, "was missing" position) of each numeric column with NULLs in training
        self.missing = [(position[("value", c.name)], position[("missing", c.name)])
                        for part, c in parts if part == "missing"]
        native = self.options.get("categorical", "native") == "native"
        self.feature_types = ["c" if part == "code" and native else "q" for part, _ in parts] or None
        self._booster: Any = None

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        # The booster's bytes have the length of its trees: the buffer takes their shape before they are loaded.
        raw = state_dict.get(prefix + BOOSTER)
        if raw is not None:
            self.booster = torch.zeros(tuple(raw.shape), dtype=torch.uint8)
            self._booster = None
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def set_booster(self, booster: Any) -> None:
        self._booster = booster
        self.booster = torch.frombuffer(bytearray(booster.save_raw("ubj")), dtype=torch.uint8)

    @property
    def xgb(self) -> Any:
        if self._booster is None:
            if not len(self.booster):
                raise PgtrainError(f"this {BOOSTED} model has no trees yet")
            xgboost = xgboost_module()
            self._booster = xgboost.Booster(model_file=bytearray(self.booster.numpy().tobytes()))
            self._booster.set_param({"nthread": torch.get_num_threads()})
        return self._booster

    def features(self, x: np.ndarray) -> np.ndarray:
        """Input rows as the booster sees them: a numeric NULL (imputed with the mean) missing again."""
        if not self.missing:
            return x
        x = np.array(x, dtype=np.float32)
        for value, was_missing in self.missing:
            x[x[:, was_missing] == 1, value] = np.nan
        return x

    def matrix(self, x: np.ndarray, label: np.ndarray | None = None, weight: np.ndarray | None = None) -> Any:
        return xgboost_module().DMatrix(self.features(x), label=label, weight=weight, missing=np.nan,
                                  feature_types=self.feature_types, enable_categorical=True)

    def standardized(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        margins = self.xgb.predict(self.matrix(x.detach().cpu().numpy()), output_margin=True, validate_features=False)
        margins = torch.from_numpy(np.asarray(margins, dtype=np.float32)).reshape(len(x), -1)
        if not self.regression and self.output_dim == 2 and margins.shape[1] == 1:
            margins = torch.cat([torch.zeros_like(margins), margins], 1)
        return margins


def build(input_dim: int, output_dim: int, options: Mapping[str, Any] | None,
          encoding: Mapping[str, Any] | None = None, task: str | None = None) -> BoostedModel:
    """The model of a boosted run or version (no trees until trained or loaded)."""
    # A version's spec records its task; without one, a single output is a regression.
    regression = task == REGRESSION if task is not None else output_dim == 1
    if regression and output_dim != 1:
        raise ConfigError(f"model {BOOSTED!r} predicts one regression target; this one has {output_dim}")
    return BoostedModel(input_dim, output_dim, options or {}, encoding, regression)
