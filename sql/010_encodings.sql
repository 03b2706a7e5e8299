-- Real tables (text and enum categories, NULLs, labels of any type): how a run's raw columns become model
-- input, and its output a label (pgtrain.data.encoding). Computed by compute_shards in the planning snapshot
-- (column kinds, imputation means, each categorical column's levels, the classes), read by every rank, and
-- recorded with the version (model_versions.spec -> 'encoding') so that predict and load_predictor encode a
-- raw row exactly as training did. NULL: a run planned before encodings, or array features.
ALTER TABLE pgtrain.training_runs ADD COLUMN IF NOT EXISTS encoding jsonb;
