-- The test part of the split (docs/configuration.md, "The split"): rows that choose nothing (no epoch, no trial),
-- on which a version's figures are read. Each shard's test rows are counted apart from its validation rows
-- (train_count + val_count + test_count = row_count); 0 for manifests planned before there was a test part.
ALTER TABLE pgtrain.shard_manifest ADD COLUMN IF NOT EXISTS test_count bigint NOT NULL DEFAULT 0
    CHECK (test_count >= 0);
COMMENT ON COLUMN pgtrain.shard_manifest.test_count IS
    'the shard''s test rows (chosen by the split''s hash; they choose nothing); 0: planned before the test part';
-- The kept parameters' figures on the test rows of all ranks, measured once after training (test_accuracy,
-- test_rmse, ...: the validation metrics' names with test_ for val_); NULL: no test rows, or trained before.
ALTER TABLE pgtrain.training_runs ADD COLUMN IF NOT EXISTS test_metrics jsonb;
COMMENT ON COLUMN pgtrain.training_runs.test_metrics IS
    'the kept parameters'' figures on the test rows (test_*), measured once after training; NULL: none';
