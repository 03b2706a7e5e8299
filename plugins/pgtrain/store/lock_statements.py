"""The statements on ``pgtrain.locks`` that ``pgtrain.store.locks`` runs: take, look up, release and renew a lease."""

# A lock of a family (sql/016_shared_plan.sql) is not taken while another group's lock of the family is held (its
# ``rival``); the caller serializes a family's acquisitions (``acquire_lock``), so two groups never both see none.
ACQUIRE = """
WITH rival AS (
    SELECT name FROM pgtrain.locks
    WHERE family = %(family)s AND lock_group IS DISTINCT FROM %(group)s AND name <> %(name)s
      AND owner IS NOT NULL AND expires_at > clock_timestamp()
    ORDER BY expires_at DESC LIMIT 1),
taken AS (
    INSERT INTO pgtrain.locks AS l (name, token, owner, acquired_at, heartbeat_at, expires_at, family, lock_group)
    SELECT %(name)s::text, nextval('pgtrain.fencing_tokens'), %(owner)s::jsonb, clock_timestamp(), clock_timestamp(),
           clock_timestamp() + %(ttl)s * interval '1 second', %(family)s::text, %(group)s::text
    WHERE NOT EXISTS (SELECT FROM rival)
    ON CONFLICT (name) DO UPDATE
       -- nextval here (not in VALUES) runs once the row lock is held: tokens grow in acquisition order.
       SET token = greatest(nextval('pgtrain.fencing_tokens'), l.token + 1),
           owner = EXCLUDED.owner,
           acquired_at = clock_timestamp(),
           heartbeat_at = clock_timestamp(),
           expires_at = clock_timestamp() + %(ttl)s * interval '1 second',
           family = EXCLUDED.family, lock_group = EXCLUDED.lock_group
       WHERE l.owner IS NULL OR l.expires_at <= clock_timestamp() OR l.owner @> %(take_over)s::jsonb
    RETURNING token, acquired_at, expires_at),
-- the expired leases of the family's other groups end with this take (a new token, as a taker gives): a stale
-- holder's late renewal or fenced write fails, rather than its group holding the family beside this one
ended AS (
    UPDATE pgtrain.locks
       SET token = nextval('pgtrain.fencing_tokens'), owner = NULL, acquired_at = NULL, heartbeat_at = NULL,
           expires_at = NULL
     WHERE family = %(family)s AND lock_group IS DISTINCT FROM %(group)s AND name <> %(name)s
       AND owner IS NOT NULL AND expires_at <= clock_timestamp() AND EXISTS (SELECT FROM taken))
SELECT true, token, NULL::jsonb, acquired_at, expires_at, NULL::float8, %(name)s::text FROM taken
UNION ALL
-- not taken: who holds it or its rival (as of this statement's snapshot), for how much longer, and which lock
SELECT false, token, owner, acquired_at, expires_at,
       extract(epoch FROM expires_at - clock_timestamp())::float8, name
FROM pgtrain.locks WHERE name = coalesce((SELECT name FROM rival), %(name)s) AND NOT EXISTS (SELECT FROM taken)
"""

HOLDER = """
SELECT token, owner, acquired_at, expires_at,
       extract(epoch FROM expires_at - clock_timestamp())::float8 AS remaining
FROM pgtrain.locks WHERE name = %s
"""

RELEASE = """
WITH released AS (
    UPDATE pgtrain.locks
       SET owner = NULL, acquired_at = NULL, heartbeat_at = NULL, expires_at = NULL
     WHERE name = %(name)s AND token = %(token)s AND owner IS NOT NULL
    RETURNING name)
SELECT pg_notify(%(channel)s, name) FROM released
"""

# SKIP LOCKED: while the holder's own fenced transaction holds the row, a renewal must not queue
# behind it (a queued renewal would still land after the holder died and extend a dead lease).
# %(owner)s: keys to change in the owner record (a null value drops its key), or NULL.
RENEW = """
UPDATE pgtrain.locks AS l
   SET heartbeat_at = clock_timestamp(), expires_at = clock_timestamp() + %(ttl)s * interval '1 second',
       owner = coalesce(jsonb_strip_nulls(l.owner || %(owner)s::jsonb), l.owner)
  FROM (SELECT name FROM pgtrain.locks
         WHERE name = %(name)s AND token = %(token)s AND owner IS NOT NULL
           FOR UPDATE SKIP LOCKED) AS mine
 WHERE l.name = mine.name
RETURNING l.expires_at
"""
