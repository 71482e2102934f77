-- pgfence 009: every order (issue 31: the third review's five holes and the
-- interleaving tester; issue 29: per-row writes and the grant made leaner;
-- issue 28: rows a producer may create; issue 32: the counter's budget).
--
-- What changes, each with the test that failed on 008 (the proofs are in
-- docs/design.md; the reference in docs/sql.md):
--
-- (filled in section by section below)

-- ---------------------------------------------------------------------------
-- 1. The grant and the check (issue 31, break 1)
-- ---------------------------------------------------------------------------

-- Every grant is a key update again: token is the key of a unique index, so
-- the UPDATE that writes a new token marks the version it replaces
-- HEAP_KEYS_UPDATED whoever runs it and at whatever savepoint depth.
--
-- Why: 003 dropped 001's lease_token_key on the argument that the grant's
-- FOR UPDATE marks the old version as key-updated all the same. It does
-- only when that row lock is the strongest lock on the version. The third
-- review (break 1) had a role with usage lock the new version FOR KEY SHARE
-- at the top level (fence.check) and then grant in a savepoint: the
-- version the grant replaced carried a MultiXact {key share by the top-level
-- xid, FOR UPDATE and a no-key update by the subtransaction}; a writer
-- whose snapshot predates the grant follows the update chain with its own
-- FOR KEY SHARE, judges each member alone, finds no conflict, and commits
-- under the superseded token (REPEATABLE READ and SERIALIZABLE), as does a
-- READ COMMITTED statement that locks many lease rows without the gate.
-- heap_update classifies an update as a key update from the columns it
-- changes (those of a unique index usable as a foreign-key target), not
-- from the locks held, so with token indexed the update member is a key
-- update, which conflicts with every FOR KEY SHARE lock: the old snapshot's
-- lock fails with 40001, and a READ COMMITTED lock waits and re-reads the
-- newest version (sqlfuncs TestGrantInASavepointAfterARowLockFailsOlderSnapshots,
-- all of which failed on 008; TestOlderSnapshotNeverPassesTheCheck).
-- The index costs a grant no measurable instructions (the shared tool's
-- grant scenario: 583 k before and after) but makes it a non-HOT update.
--
-- UNIQUE (token) rather than 001's (resource, token): tokens come from one
-- counter since 003, so no two live rows share one, and a single-column
-- index is the cheaper. Rows left from 002 (per-resource counters) may
-- share a token with another resource: each such row is revoked first (a
-- new token from the counter, as fence.revoke does, so its old holder is
-- fenced and nothing is lost but a lease that could not be told apart).
DO $$
DECLARE
    r record;
    e bigint;
BEGIN
    -- The durability triggers are deferred; ALTER TABLE refuses a table with
    -- pending trigger events, so they fire here, before it.
    SET CONSTRAINTS fence.lease_durable, fence.lease_durable_update IMMEDIATE;
    FOR r IN SELECT x.resource, x.token FROM fence.lease x
              WHERE x.token IN (SELECT y.token FROM fence.lease y GROUP BY y.token HAVING count(*) > 1)
              ORDER BY x.resource FOR UPDATE
    LOOP
        e := coalesce(e, fence._epoch());
        UPDATE fence.lease x
           SET token = fence._next_token(e, r.token), holder = NULL, kind = 'revoked',
               ended_at = pg_catalog.clock_timestamp(), expires_at = NULL, session_pid = NULL, waiters = false
         WHERE x.resource = r.resource;
        RAISE WARNING 'pgfence: the lease of resource % shared token % with another resource (a lease from before migration 3); it is revoked', r.resource, r.token;
    END LOOP;
    SET CONSTRAINTS fence.lease_durable, fence.lease_durable_update DEFERRED;
END
$$;
ALTER TABLE fence.lease ADD CONSTRAINT lease_token_key UNIQUE (token);
COMMENT ON CONSTRAINT lease_token_key ON fence.lease IS 'pgfence: makes every grant a key update, which conflicts with every FOR KEY SHARE lock of fence.check at any savepoint depth (migration 9)';

-- ---------------------------------------------------------------------------
-- 2. Epochs: restores and the counter's budget (issue 31, breaks 2 and 3;
--    issue 32)
-- ---------------------------------------------------------------------------

-- ---------------------------------------------------------------------------
-- 3. Refusal counts (issue 31, break 4)
-- ---------------------------------------------------------------------------

-- ---------------------------------------------------------------------------
-- 4. Guard functions (issue 31, break 5)
-- ---------------------------------------------------------------------------

-- ---------------------------------------------------------------------------
-- 9. Version
-- ---------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION fence.version() RETURNS integer
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT 9 $$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA fence FROM PUBLIC;
SELECT fence._regrant_usage();
