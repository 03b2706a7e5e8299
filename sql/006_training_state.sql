-- What the trainer records about a run beyond its final parameters: the version it warm-started from,
-- the layout of the model's whole state dict, and per-epoch metrics of any task (classification or regression).

-- The version the run's weights started from (init_from), NULL when trained from scratch.
ALTER TABLE pgtrain.training_runs ADD COLUMN IF NOT EXISTS init_version integer;

-- {name: {"shape": [...], "dtype": "float32"}} of the whole state dict, written by rank 0 before training:
-- what staged and committed tensors are checked against, whatever model the run trains.
ALTER TABLE pgtrain.training_runs ADD COLUMN IF NOT EXISTS model_layout jsonb;

-- The whole metrics dict of an epoch (regression adds val_rmse, val_mae, val_r2; both add samples_per_second).
-- The typed columns stay for the keys both tasks share; regression has no train accuracy.
ALTER TABLE pgtrain.run_metrics ADD COLUMN IF NOT EXISTS metrics jsonb NOT NULL DEFAULT '{}';
ALTER TABLE pgtrain.run_metrics ALTER COLUMN train_accuracy DROP NOT NULL;
