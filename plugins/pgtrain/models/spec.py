"""What the built-in model's tensors look like, without torch (the name of the built-in model, too).

The trainer's ``pgtrain.models.network.build_model("mlp", ...)`` (a ``PgtrainModel`` around the built-in MLP)
builds exactly these names and shapes (a test holds them together). Any model's full layout is recorded per run in
``training_runs.model_layout`` by the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass

BUILTIN_MLP = "mlp"


@dataclass(frozen=True)
class ModelSpec:
    input_dim: int
    hidden_sizes: tuple[int, ...]
    num_classes: int

    def layer_dims(self) -> list[int]:
        return [self.input_dim, *self.hidden_sizes, self.num_classes]

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        """name -> shape of every tensor in the model's state dict (float32)."""
        shapes: dict[str, tuple[int, ...]] = {
            "normalizer.mean": (self.input_dim,),
            "normalizer.std": (self.input_dim,),
        }
        dims = self.layer_dims()
        for index, (fan_in, fan_out) in enumerate(zip(dims, dims[1:], strict=False)):
            # Linear layers sit at even indices of the Sequential, activations between them.
            shapes[f"net.{2 * index}.weight"] = (fan_out, fan_in)
            shapes[f"net.{2 * index}.bias"] = (fan_out,)
        shapes["target.mean"] = (self.num_classes,)
        shapes["target.std"] = (self.num_classes,)
        return shapes

