-- Tensors in chunks (pgtrain.tensors): every tensor's little-endian bytes are a blob, rows of at most 64 MB in
-- pgtrain.tensor_chunks keyed by (blob_id, seq), so a tensor's size is bounded by disk, not by PostgreSQL's 1 GB
-- value limit, and is streamed with COPY. Its owners hold only its layout and blob_id: staged_parameters (a run's
-- final tensors), checkpoints (the jsonb tensor list) and model_tensors (a version's). Committing a run hands the
-- staged blobs to the version (new model_tensors rows, staged rows deleted): no tensor byte is copied.
-- A blob's chunks go when the last row that references it is deleted (the drop_unreferenced_chunks triggers),
-- whatever deletes it: the store, a cascade from training_runs, an operator.
-- The single-bytea rows of 001 become blobs (old versions keep loading) and their data columns go.

CREATE SEQUENCE IF NOT EXISTS pgtrain.tensor_blob_ids AS bigint;

CREATE TABLE IF NOT EXISTS pgtrain.tensor_chunks (
    blob_id bigint NOT NULL,
    seq     integer NOT NULL CHECK (seq >= 0),
    data    bytea NOT NULL,
    PRIMARY KEY (blob_id, seq)
);
-- Chunks are random-looking floats: no compression attempt (EXTERNAL), just out-of-line storage.
ALTER TABLE pgtrain.tensor_chunks ALTER COLUMN data SET STORAGE EXTERNAL;

-- -- staged parameters (rank 0's final tensors, waiting for commit_parameters) ------------------------------
ALTER TABLE pgtrain.staged_parameters
    ADD COLUMN IF NOT EXISTS nbytes bigint CHECK (nbytes >= 0),
    -- non-finite values counted by write_staged as it streams (NULL: not counted, commit counts them)
    ADD COLUMN IF NOT EXISTS nonfinite bigint CHECK (nonfinite >= 0),
    ADD COLUMN IF NOT EXISTS blob_id bigint;

-- -- checkpoints (latest only, per run: model, optimizer, epoch) --------------------------------------------
CREATE TABLE IF NOT EXISTS pgtrain.checkpoints (
    run_id     text PRIMARY KEY REFERENCES pgtrain.training_runs (run_id) ON DELETE CASCADE,
    epoch      integer NOT NULL CHECK (epoch >= 0),
    meta       jsonb NOT NULL DEFAULT '{}',
    -- [{"name", "shape", "dtype", "nbytes", "blob_id"}] in name order
    tensors    jsonb NOT NULL,
    written_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS checkpoints_tensors ON pgtrain.checkpoints USING gin (tensors jsonb_path_ops);

-- -- model versions ---------------------------------------------------------------------------------------
-- What rebuilding and using the version takes (model reference and options, widths, feature columns, target,
-- task, parent version, data watermark, source table); see model_store.version_spec.
ALTER TABLE pgtrain.model_versions ADD COLUMN IF NOT EXISTS spec jsonb;
ALTER TABLE pgtrain.model_tensors
    ADD COLUMN IF NOT EXISTS nbytes bigint CHECK (nbytes >= 0),
    ADD COLUMN IF NOT EXISTS blob_id bigint;

-- -- moving 001's single-bytea rows into blobs (16 MB chunks) -----------------------------------------------
UPDATE pgtrain.staged_parameters SET blob_id = nextval('pgtrain.tensor_blob_ids'), nbytes = length(data);
INSERT INTO pgtrain.tensor_chunks (blob_id, seq, data)
SELECT p.blob_id, s.seq, substring(p.data FROM s.seq * 16777216 + 1 FOR 16777216)
FROM pgtrain.staged_parameters p, generate_series(0, (length(p.data) - 1) / 16777216) AS s (seq)
WHERE length(p.data) > 0;
ALTER TABLE pgtrain.staged_parameters DROP COLUMN data;
ALTER TABLE pgtrain.staged_parameters ALTER COLUMN nbytes SET NOT NULL, ALTER COLUMN blob_id SET NOT NULL,
    ADD CONSTRAINT staged_parameters_blob_id_key UNIQUE (blob_id);

UPDATE pgtrain.model_tensors SET blob_id = nextval('pgtrain.tensor_blob_ids'), nbytes = length(data);
INSERT INTO pgtrain.tensor_chunks (blob_id, seq, data)
SELECT t.blob_id, s.seq, substring(t.data FROM s.seq * 16777216 + 1 FOR 16777216)
FROM pgtrain.model_tensors t, generate_series(0, (length(t.data) - 1) / 16777216) AS s (seq)
WHERE length(t.data) > 0;
ALTER TABLE pgtrain.model_tensors DROP COLUMN data;
ALTER TABLE pgtrain.model_tensors ALTER COLUMN nbytes SET NOT NULL, ALTER COLUMN blob_id SET NOT NULL,
    ADD CONSTRAINT model_tensors_blob_id_key UNIQUE (blob_id);

-- -- a blob's chunks live as long as a row references it ----------------------------------------------------
-- The statement's deleted rows are "gone"; a blob still referenced (a commit that moved it from
-- staged_parameters to model_tensors in this transaction inserted the new reference first) keeps its chunks.
CREATE OR REPLACE FUNCTION pgtrain.blob_referenced(blob bigint) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT FROM pgtrain.staged_parameters WHERE blob_id = blob)
        OR EXISTS (SELECT FROM pgtrain.model_tensors WHERE blob_id = blob)
        OR EXISTS (SELECT FROM pgtrain.checkpoints
                   WHERE tensors @> jsonb_build_array(jsonb_build_object('blob_id', blob)))
$$;

CREATE OR REPLACE FUNCTION pgtrain.drop_unreferenced_chunks() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME = 'checkpoints' THEN
        DELETE FROM pgtrain.tensor_chunks c
        USING (SELECT DISTINCT (t ->> 'blob_id')::bigint AS blob_id
               FROM gone, jsonb_array_elements(gone.tensors) AS t) AS g
        WHERE c.blob_id = g.blob_id AND NOT pgtrain.blob_referenced(g.blob_id);
    ELSE
        DELETE FROM pgtrain.tensor_chunks c
        USING (SELECT DISTINCT blob_id FROM gone) AS g
        WHERE c.blob_id = g.blob_id AND NOT pgtrain.blob_referenced(g.blob_id);
    END IF;
    RETURN NULL;
END;
$$;

DO $$
DECLARE
    name text;
BEGIN
    FOREACH name IN ARRAY ARRAY['staged_parameters', 'checkpoints', 'model_tensors'] LOOP
        EXECUTE format('DROP TRIGGER IF EXISTS drop_unreferenced_chunks ON pgtrain.%I', name);
        EXECUTE format('CREATE TRIGGER drop_unreferenced_chunks AFTER DELETE ON pgtrain.%I '
                       'REFERENCING OLD TABLE AS gone FOR EACH STATEMENT '
                       'EXECUTE FUNCTION pgtrain.drop_unreferenced_chunks()', name);
    END LOOP;
END;
$$;

-- -- versions and staged tensors of the 001 MLP: the built-in model's names are now net.N.* and it has the
-- target buffers (identity for classification: mean 0, std 1), so old versions load into build_model as is.
UPDATE pgtrain.model_tensors SET name = regexp_replace(name, '^layers\.', 'net.')
WHERE name ~ '^layers\.[0-9]+\.(weight|bias)$';
UPDATE pgtrain.staged_parameters SET name = regexp_replace(name, '^layers\.', 'net.')
WHERE name ~ '^layers\.[0-9]+\.(weight|bias)$';

CREATE TEMPORARY TABLE pgtrain_004_targets ON COMMIT DROP AS
SELECT v.model_name, v.version, r.num_classes, b.name, b.pattern, nextval('pgtrain.tensor_blob_ids') AS blob_id
FROM pgtrain.model_versions v
JOIN pgtrain.training_runs r ON r.run_id = v.run_id
CROSS JOIN (VALUES ('target.mean', '00000000'), ('target.std', '0000803f')) AS b (name, pattern)
WHERE r.num_classes IS NOT NULL
  AND EXISTS (SELECT FROM pgtrain.model_tensors t
              WHERE t.model_name = v.model_name AND t.version = v.version AND t.name = 'normalizer.mean')
  AND NOT EXISTS (SELECT FROM pgtrain.model_tensors t
                  WHERE t.model_name = v.model_name AND t.version = v.version AND t.name = b.name);
INSERT INTO pgtrain.model_tensors (model_name, version, name, shape, dtype, nbytes, blob_id)
SELECT model_name, version, name, ARRAY[num_classes], 'float32', 4 * num_classes, blob_id
FROM pgtrain_004_targets;
INSERT INTO pgtrain.tensor_chunks (blob_id, seq, data)
SELECT blob_id, 0, decode(repeat(pattern, num_classes), 'hex') FROM pgtrain_004_targets;

CREATE TEMPORARY TABLE pgtrain_004_staged_targets ON COMMIT DROP AS
SELECT r.run_id, r.num_classes, b.name, b.pattern, nextval('pgtrain.tensor_blob_ids') AS blob_id
FROM pgtrain.training_runs r
CROSS JOIN (VALUES ('target.mean', '00000000'), ('target.std', '0000803f')) AS b (name, pattern)
WHERE r.num_classes IS NOT NULL
  AND EXISTS (SELECT FROM pgtrain.staged_parameters p WHERE p.run_id = r.run_id AND p.name = 'normalizer.mean')
  AND NOT EXISTS (SELECT FROM pgtrain.staged_parameters p WHERE p.run_id = r.run_id AND p.name = b.name);
INSERT INTO pgtrain.staged_parameters (run_id, name, shape, dtype, nbytes, nonfinite, blob_id)
SELECT run_id, name, ARRAY[num_classes], 'float32', 4 * num_classes, 0, blob_id FROM pgtrain_004_staged_targets;
INSERT INTO pgtrain.tensor_chunks (blob_id, seq, data)
SELECT blob_id, 0, decode(repeat(pattern, num_classes), 'hex') FROM pgtrain_004_staged_targets;

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
