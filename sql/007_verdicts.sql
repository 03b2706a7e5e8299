-- Train attempts and the trainer's verdicts.
--
-- Each train attempt increments training_runs.attempt (pgtrain.runs.begin_attempt) and hands the
-- number to its ranks, whose connections carry it as the custom setting pgtrain.attempt. A write of
-- an older attempt (an orphaned rank of a killed task) to the run's rows is refused here, so it can
-- never mix with the attempt that replaced it. Connections without the setting (the Airflow side)
-- are not fenced.
ALTER TABLE pgtrain.training_runs ADD COLUMN IF NOT EXISTS attempt integer NOT NULL DEFAULT 0;

-- The trainer records why it stopped: 'training' while an attempt runs, 'refused' (bad input: a retry
-- cannot help) or 'failed' (a crash) with status_reason; launchers read it instead of log text.
ALTER TABLE pgtrain.training_runs DROP CONSTRAINT IF EXISTS training_runs_status_check;
ALTER TABLE pgtrain.training_runs ADD CONSTRAINT training_runs_status_check
    CHECK (status IN ('planned', 'sharded', 'training', 'trained', 'refused', 'failed', 'committed', 'rejected'));

CREATE OR REPLACE FUNCTION pgtrain.refuse_stale_attempt() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    claimed text := current_setting('pgtrain.attempt', true);
    row_run text;
    current_attempt integer;
BEGIN
    IF claimed IS NOT NULL AND claimed <> '' THEN
        IF TG_TABLE_NAME = 'training_runs' THEN
            current_attempt := OLD.attempt;
            row_run := OLD.run_id;
        ELSE
            IF TG_OP = 'DELETE' THEN
                row_run := OLD.run_id;
            ELSE
                row_run := NEW.run_id;
            END IF;
            -- FOR SHARE: begin_attempt (an UPDATE of this row) waits for this write's transaction, and a
            -- write that waited sees the new attempt; so no write of an old attempt lands after it began.
            SELECT attempt INTO current_attempt FROM pgtrain.training_runs WHERE run_id = row_run FOR SHARE;
        END IF;
        IF current_attempt IS NOT NULL AND claimed::integer < current_attempt THEN
            RAISE EXCEPTION 'stale train attempt % of run %: attempt % has started since; this write is refused',
                claimed, row_run, current_attempt
                USING ERRCODE = 'PT409',
                      HINT = 'an orphaned rank of an earlier attempt of the train task is still running; stop it';
        END IF;
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END;
$$;

DROP TRIGGER IF EXISTS refuse_stale_attempt ON pgtrain.training_runs;
CREATE TRIGGER refuse_stale_attempt BEFORE UPDATE OR DELETE ON pgtrain.training_runs
    FOR EACH ROW EXECUTE FUNCTION pgtrain.refuse_stale_attempt();

-- Every table a trainer writes per run (checkpoints is created by 004): those that exist, keyed by run_id.
-- Tensor bytes (004's tensor_chunks) are written in the transaction that first writes their layout rows here.
DO $$
DECLARE
    name text;
BEGIN
    FOREACH name IN ARRAY ARRAY['run_metrics', 'staged_parameters', 'checkpoints'] LOOP
        IF EXISTS (SELECT FROM pg_attribute
                   WHERE attrelid = to_regclass(format('pgtrain.%I', name)) AND attname = 'run_id'
                     AND NOT attisdropped) THEN
            EXECUTE format('DROP TRIGGER IF EXISTS refuse_stale_attempt ON pgtrain.%I', name);
            EXECUTE format('CREATE TRIGGER refuse_stale_attempt BEFORE INSERT OR UPDATE OR DELETE ON pgtrain.%I '
                           'FOR EACH ROW EXECUTE FUNCTION pgtrain.refuse_stale_attempt()', name);
        END IF;
    END LOOP;
END;
$$;
