-- Fencing tokens, the small-parameter store, and the head's audit trail.

-- One sequence for every lock's fencing tokens: per lock they only grow, and they keep growing even
-- if a locks row is deleted by hand (a per-row counter would restart at 1 and be refused forever).
CREATE SEQUENCE IF NOT EXISTS pgtrain.fencing_tokens AS bigint;
SELECT setval('pgtrain.fencing_tokens', greatest(max(token), 1))
FROM pgtrain.locks HAVING max(token) > 0;

-- Small named values (get_parameter / update_parameter), each write a new version, fenced by a lease.
CREATE TABLE IF NOT EXISTS pgtrain.parameters (
    name          text PRIMARY KEY,
    value         jsonb NOT NULL,
    version       bigint NOT NULL CHECK (version >= 1),
    fencing_token bigint NOT NULL,
    lock_name     text NOT NULL,
    updated_at    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS pgtrain.parameter_history (
    name          text NOT NULL,
    version       bigint NOT NULL,
    value         jsonb NOT NULL,
    fencing_token bigint NOT NULL,
    written_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, version)
);

-- Every move of a model head (commit, promote, rollback), for operators.
CREATE TABLE IF NOT EXISTS pgtrain.model_head_history (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    model_name       text NOT NULL,
    version          integer NOT NULL,
    previous_version integer,
    fencing_token    bigint NOT NULL,
    action           text NOT NULL CHECK (action IN ('commit', 'promote')),
    owner            jsonb,
    moved_at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS model_head_history_model ON pgtrain.model_head_history (model_name, id);
