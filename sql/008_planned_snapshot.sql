-- Rows "as of" the planning snapshot are now chosen by the snapshot's own visibility rule (pgtrain.source.planned_rows):
-- a row was planned iff its xmin committed before the snapshot (below its xmin, or below its xmax and not one of
-- pg_snapshot_xip), so the plan no longer lists the xmin of every transaction that touched the table. seen_xmins
-- keeps only what that rule would misjudge: raw xmins of frozen planned rows that wrapped onto an in-progress xid
-- or to at/after xmax. Existing plans stay valid as stored: their seen_xmins (every planned xmin from the
-- snapshot's xmin on) holds all of those, and their xid_horizon (at most xmin + 2^30) is nearer than a new plan's.
COMMENT ON COLUMN pgtrain.shard_plans.snapshot IS
    'the REPEATABLE READ snapshot the manifest was cut in; a row is planned iff visible to it (source.planned_rows)';
COMMENT ON COLUMN pgtrain.shard_plans.seen_xmins IS
    'raw xmins of frozen planned rows that wrapped onto an in-progress xid of snapshot, or to at/after its xmax';
COMMENT ON COLUMN pgtrain.shard_plans.xid_horizon IS
    '64-bit xid: seen_xmins is complete below it, and a load that starts at or past it refuses';
