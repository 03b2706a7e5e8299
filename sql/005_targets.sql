-- Regression targets next to classification labels (pgtrain.source, manifest, runs).

-- The model's output width: the number of classes for classification, the target's width for regression
-- (1 for a scalar target column, the array length for an array target). num_classes stays classification-only.
ALTER TABLE pgtrain.training_runs ADD COLUMN IF NOT EXISTS output_dim integer CHECK (output_dim > 0);
