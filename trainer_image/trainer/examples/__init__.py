"""Example model factories for ``model="package.module:factory"`` (shipped in the trainer image)."""
