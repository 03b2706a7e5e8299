"""Study (issue 31 item 2): would periodic numeric embeddings make a better default mlp? Not a benchmark of record
(``run_all`` runs ``bench_*.py`` only); benchmarks/RESULTS.md, "Periodic numeric embeddings", has its figures.

    .venv/bin/python benchmarks/study_periodic_embeddings.py [TABLE ...]   # default: the six tables below

bench_quality's own ``measure()`` on the same rows and split, with the built-in mlp, and as its references small
networks trained the way the built-in mlp trains by default (``TrainingConfig``'s auto batch size, auto AdamW
learning rate and weight decay, epochs and early-stopping patience on the validation rows; figures on the test
rows), each with or without ``rtdl_num_embeddings.PeriodicEmbeddings`` (Gorishniy et al. 2022, "PLR" lite: k = 48
trainable frequencies per number, initialised with scale sigma, then a shared Linear + ReLU to d = 16) in front of
the numbers (the one-hot columns pass as they are). ``e_mlp`` is the same network without the embeddings, so each
variant's difference to it is the embeddings' effect at one seed.
"""

from __future__ import annotations

import sys

import bench_quality
import numpy as np
import quality_references as refs

from pgtrain.config.params import TrainingConfig

# name: (hidden sizes, the embeddings' frequency scale sigma or None for none)
VARIANTS = {"e_mlp": ((50,), None), "e_plr_0.01": ((50,), 0.01), "e_plr_0.1": ((50,), 0.1),
            "e_plr_1": ((50,), 1.0), "e_plr_0.1_128x128": ((128, 128), 0.1)}
EMBEDDING_WIDTH = 16
TABLES = ("computers", "diabetes", "slid", "males", "vietnam", "hdma")


def network(name: str, data: refs.Data) -> tuple[np.ndarray, dict[str, float | int | bool]]:
    import torch
    from rtdl_num_embeddings import PeriodicEmbeddings

    torch.manual_seed(refs.SEED)
    hidden, sigma = VARIANTS[name]
    # refs.inputs standardizes the numbers (and their missing-value indicators): one-hot columns are the 0/1 ones.
    numeric = [j for j in range(data.x_train.shape[1]) if not np.isin(data.x_train[:, j], (0.0, 1.0)).all()]
    one_hot = sorted(set(range(data.x_train.shape[1])) - set(numeric))

    class Network(torch.nn.Module):
        """The numbers (through the embeddings, if any), then the one-hot columns, into an MLP."""

        def __init__(self) -> None:
            super().__init__()
            self.embed = (PeriodicEmbeddings(len(numeric), EMBEDDING_WIDTH, frequency_init_scale=sigma, lite=True)
                          if sigma is not None else None)
            width = (len(numeric) * EMBEDDING_WIDTH if sigma is not None else len(numeric)) + len(one_hot)
            layers: list[torch.nn.Module] = []
            for size in hidden:
                layers += [torch.nn.Linear(width, size), torch.nn.ReLU()]
                width = size
            self.net = torch.nn.Sequential(*layers, torch.nn.Linear(width, 1 if data.regression else data.classes))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            numbers = x[:, numeric]
            if self.embed is not None:
                numbers = self.embed(numbers).flatten(1)
            return self.net(torch.cat([numbers, x[:, one_hot]], 1))

    config = TrainingConfig()
    batch = config.batch_size_for(len(data.x_train))
    predicted, epochs, _ = refs.fit_network(Network(), data, config.learning_rate_for(batch),
                                            config.weight_decay_value, batch, config.epochs,
                                            config.early_stopping_patience)
    return predicted, {"epochs": epochs}


def main(tables: list[str]) -> None:
    refs.NETWORKS = tuple(VARIANTS)
    refs._network = network
    refs.references = lambda regression: tuple(VARIANTS)
    bench_quality.built_ins = lambda: ("mlp",)
    bench_quality.main(tables or list(TABLES))


if __name__ == "__main__":
    main(sys.argv[1:])
