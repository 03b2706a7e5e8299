"""What a model's parameters must look like, without torch: the commit step checks staged tensors against it.

The trainer's ``trainer.model.MLP`` builds exactly these names and shapes (a test holds them together).
"""

from __future__ import annotations

from dataclasses import dataclass


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
            shapes[f"layers.{2 * index}.weight"] = (fan_out, fan_in)
            shapes[f"layers.{2 * index}.bias"] = (fan_out,)
        return shapes
