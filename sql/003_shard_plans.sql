-- What compute_shards saw, so that every rank reads exactly the planned rows (pgtrain.source, manifest, loader).

-- One row per planned run: the REPEATABLE READ snapshot the manifest was cut in, and the bad-row report.
-- Rows are later selected "as of" this snapshot by their xmin (see source.planned_rows): seen_xmins lists the
-- raw 32-bit xmins of planned rows at or after the snapshot's xmin, complete below xid_horizon.
CREATE TABLE IF NOT EXISTS pgtrain.shard_plans (
    run_id          text PRIMARY KEY REFERENCES pgtrain.training_runs (run_id) ON DELETE CASCADE,
    snapshot        pg_snapshot NOT NULL,
    seen_xmins      xid[] NOT NULL,
    xid_horizon     bigint NOT NULL,
    -- input_dim and num_classes live in training_runs, row counts in shard_manifest, the policy in the config
    excluded_rows   bigint NOT NULL CHECK (excluded_rows >= 0),
    bad_rows        jsonb NOT NULL,
    batch_rows      integer NOT NULL CHECK (batch_rows > 1),
    planned_at      timestamptz NOT NULL DEFAULT now()
);

-- Each rank's key range cut into consecutive batches (inclusive key bounds, key order): the loader streams one
-- COPY row per batch instead of one per sample.
CREATE TABLE IF NOT EXISTS pgtrain.shard_batches (
    run_id   text NOT NULL,
    rank     integer NOT NULL,
    batch_lo text[] NOT NULL,
    batch_hi text[] NOT NULL CHECK (cardinality(batch_hi) = cardinality(batch_lo)),
    PRIMARY KEY (run_id, rank),
    FOREIGN KEY (run_id, rank) REFERENCES pgtrain.shard_manifest (run_id, rank) ON DELETE CASCADE
);

-- example_keys(key): the first 10 keys it is given (the bad-row check's examples), in one pass, bounded memory.
CREATE OR REPLACE FUNCTION pgtrain.append_example(examples text[], example text) RETURNS text[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF cardinality(examples) < 10 THEN
        RETURN examples || example;
    END IF;
    RETURN examples;
END
$$;

CREATE OR REPLACE AGGREGATE pgtrain.example_keys(text) (
    SFUNC = pgtrain.append_example,
    STYPE = text[],
    INITCOND = '{}'
);
