-- A search (pgtrain.config.search): N trials over one plan, the best one committed. The search's own run (its
-- config holds the search block) is planned once: its manifest, shard plan and encoding. Each trial is a training
-- run of its own (its attempt, verdict, checkpoint, metrics and staged parameters, as any run), whose plan is a
-- copy of the search run's made in one transaction (pgtrain.runs.trials.create_trials): the same snapshot, key
-- ranges, batches and encoding, so every trial reads exactly the rows the search planned.
CREATE TABLE IF NOT EXISTS pgtrain.search_trials (
    search_run  text NOT NULL REFERENCES pgtrain.training_runs (run_id) ON DELETE CASCADE,
    trial       integer NOT NULL CHECK (trial > 0),
    run_id      text NOT NULL UNIQUE REFERENCES pgtrain.training_runs (run_id) ON DELETE CASCADE,
    params      jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (search_run, trial)
);
COMMENT ON TABLE pgtrain.search_trials IS
    'one row per trial of a search: its training run and the params it tried over the search run''s';

-- The choice: by which validation metric (and its direction), which trial, and why, in words.
CREATE TABLE IF NOT EXISTS pgtrain.search_choices (
    search_run        text PRIMARY KEY REFERENCES pgtrain.training_runs (run_id) ON DELETE CASCADE,
    metric            text NOT NULL,
    higher_is_better  boolean NOT NULL,
    chosen_trial      integer,
    chosen_run        text REFERENCES pgtrain.training_runs (run_id),
    explanation       text NOT NULL,
    decided_at        timestamptz NOT NULL DEFAULT now(),
    CHECK ((chosen_trial IS NULL) = (chosen_run IS NULL))
);
COMMENT ON TABLE pgtrain.search_choices IS
    'which trial of a search was chosen (NULL: none trained) by which validation metric, and why';
