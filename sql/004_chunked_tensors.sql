-- Tensors in chunks (pgtrain.tensors): one layout row per tensor, its little-endian bytes in rows of at most
-- 64 MB, so a tensor's size is bounded by disk, not by PostgreSQL's 1 GB value limit, and is streamed with COPY.
-- Staged parameters, checkpoints and model versions each get a chunk table; the single-bytea rows of 001 move
-- into them (old versions keep loading) and their data columns go.

-- Chunks are random-looking floats: no compression attempt (EXTERNAL), just out-of-line storage.

-- -- staged parameters (rank 0's final tensors, waiting for commit_parameters) ------------------------------
ALTER TABLE pgtrain.staged_parameters
    ADD COLUMN IF NOT EXISTS nbytes bigint CHECK (nbytes >= 0),
    -- non-finite values counted by write_staged as it streams (NULL: not counted, commit counts them)
    ADD COLUMN IF NOT EXISTS nonfinite bigint CHECK (nonfinite >= 0);

CREATE TABLE IF NOT EXISTS pgtrain.staged_chunks (
    run_id text NOT NULL,
    name   text NOT NULL,
    seq    integer NOT NULL CHECK (seq >= 0),
    data   bytea NOT NULL,
    PRIMARY KEY (run_id, name, seq),
    -- deferred: chunks stream in before the layout row that counts their non-finite values
    FOREIGN KEY (run_id, name) REFERENCES pgtrain.staged_parameters (run_id, name)
        ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED
);
ALTER TABLE pgtrain.staged_chunks ALTER COLUMN data SET STORAGE EXTERNAL;

-- -- checkpoints (latest only, per run: model, optimizer, epoch) --------------------------------------------
CREATE TABLE IF NOT EXISTS pgtrain.checkpoints (
    run_id     text PRIMARY KEY REFERENCES pgtrain.training_runs (run_id) ON DELETE CASCADE,
    epoch      integer NOT NULL CHECK (epoch >= 0),
    meta       jsonb NOT NULL DEFAULT '{}',
    -- [{"name", "shape", "dtype", "nbytes"}] in name order
    tensors    jsonb NOT NULL,
    written_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS pgtrain.checkpoint_chunks (
    run_id text NOT NULL,
    name   text NOT NULL,
    seq    integer NOT NULL CHECK (seq >= 0),
    data   bytea NOT NULL,
    PRIMARY KEY (run_id, name, seq),
    FOREIGN KEY (run_id) REFERENCES pgtrain.checkpoints (run_id) ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED
);
ALTER TABLE pgtrain.checkpoint_chunks ALTER COLUMN data SET STORAGE EXTERNAL;

-- -- model versions ---------------------------------------------------------------------------------------
-- What rebuilding and using the version takes (model reference and options, widths, feature columns, target,
-- task, parent version, data watermark, source table); see model_store.version_spec.
ALTER TABLE pgtrain.model_versions ADD COLUMN IF NOT EXISTS spec jsonb;
ALTER TABLE pgtrain.model_tensors ADD COLUMN IF NOT EXISTS nbytes bigint CHECK (nbytes >= 0);

CREATE TABLE IF NOT EXISTS pgtrain.model_chunks (
    model_name text NOT NULL,
    version    integer NOT NULL,
    name       text NOT NULL,
    seq        integer NOT NULL CHECK (seq >= 0),
    data       bytea NOT NULL,
    PRIMARY KEY (model_name, version, name, seq),
    FOREIGN KEY (model_name, version, name) REFERENCES pgtrain.model_tensors (model_name, version, name)
        ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED
);
ALTER TABLE pgtrain.model_chunks ALTER COLUMN data SET STORAGE EXTERNAL;

-- -- moving 001's single-bytea rows into chunks (16 MB each) -------------------------------------------------
INSERT INTO pgtrain.staged_chunks (run_id, name, seq, data)
SELECT p.run_id, p.name, s.seq, substring(p.data FROM s.seq * 16777216 + 1 FOR 16777216)
FROM pgtrain.staged_parameters p, generate_series(0, (length(p.data) - 1) / 16777216) AS s (seq)
WHERE length(p.data) > 0;
UPDATE pgtrain.staged_parameters SET nbytes = length(data);
ALTER TABLE pgtrain.staged_parameters DROP COLUMN data;
ALTER TABLE pgtrain.staged_parameters ALTER COLUMN nbytes SET NOT NULL;

INSERT INTO pgtrain.model_chunks (model_name, version, name, seq, data)
SELECT t.model_name, t.version, t.name, s.seq, substring(t.data FROM s.seq * 16777216 + 1 FOR 16777216)
FROM pgtrain.model_tensors t, generate_series(0, (length(t.data) - 1) / 16777216) AS s (seq)
WHERE length(t.data) > 0;
UPDATE pgtrain.model_tensors SET nbytes = length(data);
ALTER TABLE pgtrain.model_tensors DROP COLUMN data;
ALTER TABLE pgtrain.model_tensors ALTER COLUMN nbytes SET NOT NULL;

-- -- versions and staged tensors of the 001 MLP: the built-in model's names are now net.N.* and it has the
-- target buffers (identity for classification: mean 0, std 1), so old versions load into build_model as is.
UPDATE pgtrain.model_tensors SET name = regexp_replace(name, '^layers\.', 'net.')
WHERE name ~ '^layers\.[0-9]+\.(weight|bias)$';
UPDATE pgtrain.model_chunks SET name = regexp_replace(name, '^layers\.', 'net.')
WHERE name ~ '^layers\.[0-9]+\.(weight|bias)$';
UPDATE pgtrain.staged_parameters SET name = regexp_replace(name, '^layers\.', 'net.')
WHERE name ~ '^layers\.[0-9]+\.(weight|bias)$';
UPDATE pgtrain.staged_chunks SET name = regexp_replace(name, '^layers\.', 'net.')
WHERE name ~ '^layers\.[0-9]+\.(weight|bias)$';

CREATE TEMPORARY TABLE pgtrain_004_targets ON COMMIT DROP AS
SELECT v.model_name, v.version, r.num_classes, b.name, b.pattern
FROM pgtrain.model_versions v
JOIN pgtrain.training_runs r ON r.run_id = v.run_id
CROSS JOIN (VALUES ('target.mean', '00000000'), ('target.std', '0000803f')) AS b (name, pattern)
WHERE r.num_classes IS NOT NULL
  AND EXISTS (SELECT FROM pgtrain.model_tensors t
              WHERE t.model_name = v.model_name AND t.version = v.version AND t.name = 'normalizer.mean')
  AND NOT EXISTS (SELECT FROM pgtrain.model_tensors t
                  WHERE t.model_name = v.model_name AND t.version = v.version AND t.name = b.name);
INSERT INTO pgtrain.model_tensors (model_name, version, name, shape, dtype, nbytes)
SELECT model_name, version, name, ARRAY[num_classes], 'float32', 4 * num_classes FROM pgtrain_004_targets;
INSERT INTO pgtrain.model_chunks (model_name, version, name, seq, data)
SELECT model_name, version, name, 0, decode(repeat(pattern, num_classes), 'hex') FROM pgtrain_004_targets;

INSERT INTO pgtrain.staged_parameters (run_id, name, shape, dtype, nbytes, nonfinite)
SELECT r.run_id, b.name, ARRAY[r.num_classes], 'float32', 4 * r.num_classes, 0
FROM pgtrain.training_runs r
CROSS JOIN (VALUES ('target.mean'), ('target.std')) AS b (name)
WHERE r.num_classes IS NOT NULL
  AND EXISTS (SELECT FROM pgtrain.staged_parameters p WHERE p.run_id = r.run_id AND p.name = 'normalizer.mean')
  AND NOT EXISTS (SELECT FROM pgtrain.staged_parameters p WHERE p.run_id = r.run_id AND p.name = b.name);
INSERT INTO pgtrain.staged_chunks (run_id, name, seq, data)
SELECT p.run_id, p.name, 0, decode(repeat(CASE p.name WHEN 'target.mean' THEN '00000000' ELSE '0000803f' END,
                                          r.num_classes), 'hex')
FROM pgtrain.staged_parameters p JOIN pgtrain.training_runs r USING (run_id)
WHERE p.name IN ('target.mean', 'target.std')
  AND NOT EXISTS (SELECT FROM pgtrain.staged_chunks c WHERE c.run_id = p.run_id AND c.name = p.name);

-- Old versions were the built-in MLP classifier: record what rebuilding them takes.
UPDATE pgtrain.model_versions v SET spec = jsonb_build_object(
    'model', 'mlp',
    'model_options', jsonb_build_object('hidden_sizes', r.config -> 'hidden_sizes'),
    'input_dim', r.input_dim,
    'output_dim', r.num_classes,
    'feature_columns', jsonb_build_array(r.config ->> 'features_column'),
    'target_column', r.config ->> 'label_column',
    'task', 'classification',
    'standardize_target', false,
    'parent_version', NULL,
    'source_table', r.config ->> 'source_table',
    'key_column', r.config ->> 'key_column',
    'watermark', (SELECT jsonb_build_object(
                      'snapshot', p.snapshot::text,
                      'max_key', (SELECT m.key_hi FROM pgtrain.shard_manifest m
                                  WHERE m.run_id = r.run_id ORDER BY m.rank DESC LIMIT 1))
                  FROM pgtrain.shard_plans p WHERE p.run_id = r.run_id))
FROM pgtrain.training_runs r
WHERE r.run_id = v.run_id AND v.spec IS NULL;
