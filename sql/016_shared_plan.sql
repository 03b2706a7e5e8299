-- One plan for all trials of a search (issue 34): a trial's run reads the search run's manifest, shard plan and
-- batches instead of a copy. plan_run names the run whose plan a run reads; NULL: its own (every run that is no
-- trial, and the trials planned before this migration, which hold copies of their search's plan).
ALTER TABLE pgtrain.training_runs ADD COLUMN IF NOT EXISTS plan_run text REFERENCES pgtrain.training_runs (run_id);
COMMENT ON COLUMN pgtrain.training_runs.plan_run IS
    'the run whose plan (shard_manifest, shard_plans, shard_batches) this run reads; NULL: its own';
CREATE INDEX IF NOT EXISTS training_runs_plan_run ON pgtrain.training_runs (plan_run) WHERE plan_run IS NOT NULL;

-- The run whose plan rows a run reads: every reader of the plan tables resolves a run through this, and only this.
CREATE OR REPLACE FUNCTION pgtrain.plan_of(run text) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
AS $$ SELECT coalesce(r.plan_run, r.run_id) FROM pgtrain.training_runs r WHERE r.run_id = run $$;

-- A plan other runs read is never deleted nor planned again under them (replanning deletes the manifest first):
-- their ranks, commit checks and versions' records read it.
CREATE OR REPLACE FUNCTION pgtrain.keep_shared_plan() RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    reader text;
BEGIN
    SELECT r.run_id INTO reader FROM pgtrain.training_runs r WHERE r.plan_run = OLD.run_id LIMIT 1;
    IF reader IS NOT NULL THEN
        RAISE EXCEPTION 'the plan of run % is read by run % (a trial of its search): it is neither deleted nor '
                        'planned again; start a new DAG run to plan the search anew', OLD.run_id, reader
            USING ERRCODE = 'restrict_violation';
    END IF;
    RETURN OLD;
END
$$;

DROP TRIGGER IF EXISTS keep_shared_plan ON pgtrain.shard_manifest;
CREATE TRIGGER keep_shared_plan BEFORE DELETE ON pgtrain.shard_manifest
    FOR EACH ROW EXECUTE FUNCTION pgtrain.keep_shared_plan();
DROP TRIGGER IF EXISTS keep_shared_plan ON pgtrain.shard_plans;
CREATE TRIGGER keep_shared_plan BEFORE DELETE ON pgtrain.shard_plans
    FOR EACH ROW EXECUTE FUNCTION pgtrain.keep_shared_plan();

-- The training claims of one model exclude each other unless they are of one group (pgtrain.launch.attempt): the
-- trials of one search train side by side, each under its own claim, but beside no plain run of the model nor
-- another search's trials. family: the claims that exclude each other (NULL: the lock excludes only itself).
ALTER TABLE pgtrain.locks ADD COLUMN IF NOT EXISTS family text;
ALTER TABLE pgtrain.locks ADD COLUMN IF NOT EXISTS lock_group text;
COMMENT ON COLUMN pgtrain.locks.family IS
    'locks of one family exclude each other while held, unless of one lock_group; NULL: no family';
CREATE INDEX IF NOT EXISTS locks_family ON pgtrain.locks (family) WHERE family IS NOT NULL;

-- Training claims held while this migration runs join their model's family (launch.attempt.claim_family): a plain
-- run's group is its run, a trial's (training:<model>#<search run>/trial-<n>) its search run.
UPDATE pgtrain.locks
   SET family = split_part(name, '#', 1),
       lock_group = CASE WHEN position('#' IN name) > 0
                         THEN regexp_replace(substr(name, position('#' IN name) + 1), '/trial-[0-9]+$', '')
                         ELSE owner ->> 'training_run' END
 WHERE name LIKE 'training:%' AND family IS NULL AND owner IS NOT NULL;
