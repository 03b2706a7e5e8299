-- New-data retraining (pgtrain.freshness, pgtrain.airflow.new_rows_trigger).
--
-- A model's rows are "new" when their key is above the watermark of the model's head version
-- (model_versions.spec -> watermark -> max_key) and above the key its last new-rows event fired at.
-- One row per watched model records that event, so a restarted (or second) triggerer never fires
-- again for the same rows: the row is claimed with a compare-and-set on fired_key before the event
-- is sent. Keys are stored in their text form, compared in the source key's own type.
-- The first look at a model with no version records a baseline (events = 0, new_rows = 0): the rows
-- already there when watching began are not new, so unpausing a model's DAG starts no run by itself.
CREATE TABLE IF NOT EXISTS pgtrain.new_rows_events (
    model_name   text PRIMARY KEY,
    source_table text NOT NULL,          -- schema-qualified, quoted: what the key belongs to
    key_column   text NOT NULL,
    fired_key    text NOT NULL,          -- the largest key when the last event fired
    head_version integer,                -- the model's head then
    new_rows     bigint NOT NULL CHECK (new_rows >= 0),  -- new rows counted then (up to the threshold)
    events       bigint NOT NULL DEFAULT 1 CHECK (events >= 0),  -- 0: the baseline, no event yet
    fired_at     timestamptz NOT NULL DEFAULT now()
);
