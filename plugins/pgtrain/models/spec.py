"""What the built-in model's tensors look like, without torch (the name of the built-in model, too).

The trainer's ``pgtrain.models.network.build_model("mlp", ...)`` (a ``PgtrainModel`` around the built-in MLP)
builds exactly these names and shapes (a test holds them together). Any model's full layout is recorded per run in
``training_runs.model_layout`` by the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass

from pgtrain.config.param_schemas import BUILTIN_MLP

__all__ = ["BUILTIN_MLP", "ModelSpec"]


@dataclass(frozen=True)
class ModelSpec:
    """The built-in's layout: one plain MLP (``members`` 1: every version from before the ensemble), or a
    shared-weight ensemble of ``members`` (``pgtrain.models.ensemble``); ``clamp_target``: a regression's range
    buffers."""

    input_dim: int
    hidden_sizes: tuple[int, ...]
    num_classes: int
    members: int = 1
    clamp_target: bool = False

    def layer_dims(self) -> list[int]:
        return [self.input_dim, *self.hidden_sizes, self.num_classes]

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        """name -> shape of every tensor in the model's state dict (float32)."""
        shapes: dict[str, tuple[int, ...]] = {
            "normalizer.mean": (self.input_dim,),
            "normalizer.std": (self.input_dim,),
        }
        dims = self.layer_dims()
        if self.members > 1:
            shapes |= self._ensemble_shapes(dims)
        else:
            for index, (fan_in, fan_out) in enumerate(zip(dims, dims[1:], strict=False)):
                # Linear layers sit at even indices of the Sequential, activations between them.
                shapes[f"net.{2 * index}.weight"] = (fan_out, fan_in)
                shapes[f"net.{2 * index}.bias"] = (fan_out,)
        shapes["target.mean"] = (self.num_classes,)
        shapes["target.std"] = (self.num_classes,)
        if self.clamp_target:
            shapes["target.low"] = (self.num_classes,)
            shapes["target.high"] = (self.num_classes,)
        return shapes

    def _ensemble_shapes(self, dims: list[int]) -> dict[str, tuple[int, ...]]:
        k, shapes = self.members, {}
        for index, (fan_in, fan_out) in enumerate(zip(dims[:-2], dims[1:-1], strict=True)):
            prefix = f"net.hidden.{2 * index}"  # each hidden Linear, then its ReLU
            shapes |= {f"{prefix}.weight": (fan_out, fan_in), f"{prefix}.r": (k, fan_in),
                       f"{prefix}.s": (k, fan_out), f"{prefix}.bias": (k, fan_out)}
        shapes["net.output.weight"] = (k, dims[-2], dims[-1])
        shapes["net.output.bias"] = (k, dims[-1])
        return shapes

