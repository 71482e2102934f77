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

-- A refusal in a read-only transaction is counted too. 008 skipped the
-- count whenever transaction_read_only was on (nextval fails there and would
-- replace the refusal's SQLSTATE with its own), and a usage role could turn
-- it on for one statement (set_config('transaction_read_only', 'on', true)
-- in the WHERE clause of a stale write): the write was refused and nothing
-- was counted (break 4; TestRefusalsCountWritesThatTurnedReadOnlyOn).
-- A read-only transaction cannot write anything a later reader sees, but it
-- can scan an index, and PostgreSQL's cumulative statistics count index
-- scans whatever the transaction: so a read-only refusal scans the partial
-- index of its SQLSTATE on an empty table (seqscan and bitmapscan off, so
-- the plan is that index scan whatever the planner estimates), and
-- fence.refusals adds pg_stat_get_numscans of the three indexes to the
-- sequences. Those counts reach the view when the backend reports its
-- statistics (at the latest when its transaction ends and at most a second
-- later, or when it disconnects), live in the server's statistics, not in
-- the database (a standby counts its own; pg_stat_reset clears them; a
-- dump does not carry them), and count scans by nobody else: the table is
-- the kit owner's, readable by no other role, and only fence._refuse
-- (SECURITY DEFINER) scans it.
CREATE TABLE fence.refusal_marks (code text COLLATE "C" NOT NULL);
COMMENT ON TABLE fence.refusal_marks IS 'pgfence internal: always empty; fence._refuse scans its indexes to count refusals in read-only transactions (read fence.refusals)';
REVOKE ALL ON fence.refusal_marks FROM PUBLIC;
CREATE INDEX refusal_marks_fn001 ON fence.refusal_marks (code) WHERE code = 'FN001';
CREATE INDEX refusal_marks_fn002 ON fence.refusal_marks (code) WHERE code = 'FN002';
CREATE INDEX refusal_marks_fn003 ON fence.refusal_marks (code) WHERE code = 'FN003';

CREATE OR REPLACE FUNCTION fence._refuse(code text, message text, detail text, hint text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
BEGIN
    IF current_setting('transaction_read_only') = 'off' THEN
        PERFORM nextval(CASE code WHEN 'FN001' THEN 'fence.refusals_fn001'::regclass
                                  WHEN 'FN002' THEN 'fence.refusals_fn002'::regclass
                                  WHEN 'FN003' THEN 'fence.refusals_fn003'::regclass END);
    ELSIF code = 'FN001' THEN
        PERFORM FROM fence.refusal_marks m WHERE m.code = 'FN001';
    ELSIF code = 'FN002' THEN
        PERFORM FROM fence.refusal_marks m WHERE m.code = 'FN002';
    ELSIF code = 'FN003' THEN
        PERFORM FROM fence.refusal_marks m WHERE m.code = 'FN003';
    END IF;
    RAISE EXCEPTION USING ERRCODE = code, MESSAGE = message, DETAIL = detail, HINT = hint;
END
$$;

CREATE OR REPLACE VIEW fence.refusals AS
SELECT 'FN001'::text AS sqlstate, 'stale token'::text AS reason,
       CASE WHEN s.is_called THEN s.last_value ELSE 0 END
       + pg_stat_get_numscans('fence.refusal_marks_fn001'::regclass) AS count FROM fence.refusals_fn001 s
UNION ALL
SELECT 'FN002', 'no token', CASE WHEN s.is_called THEN s.last_value ELSE 0 END
       + pg_stat_get_numscans('fence.refusal_marks_fn002'::regclass) FROM fence.refusals_fn002 s
UNION ALL
SELECT 'FN003', 'token never granted', CASE WHEN s.is_called THEN s.last_value ELSE 0 END
       + pg_stat_get_numscans('fence.refusal_marks_fn003'::regclass) FROM fence.refusals_fn003 s;

-- ---------------------------------------------------------------------------
-- 4. Guard functions (issue 31, break 5)
-- ---------------------------------------------------------------------------

-- The guard functions the kit generates are bounded by the triggers that
-- use them. fence._guard_function and fence._rows_function create one
-- function per token column name (per resource and token column name for
-- per-row tables), owned by the kit's owner; a usage role that owns any
-- table could make them create one per name without bound by renaming a
-- column in a loop (break 5: 2000 functions in about 4 s). Now each call,
-- once it holds the creation lock of its own name, drops every generated
-- function that no trigger uses, but its own: after any call at most one
-- unused generated function is left per transaction still creating one.
-- A function is dropped only under its own creation lock, taken with a try
-- (a concurrent protect of that name holds it until it commits, and its
-- trigger is then in pg_depend), and only if pg_depend has no object that
-- depends on it; no lock is waited for, so two protects never deadlock
-- here (TestGuardFunctionsAreBoundedByTheTriggersThatUseThem).
CREATE FUNCTION fence._drop_unused_guards(keep text) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    f record;
BEGIN
    FOR f IN SELECT p.oid, p.proname FROM pg_proc p
              WHERE p.pronamespace = 'fence'::regnamespace
                AND p.proname ~ '^_(guard|rows)_[0-9a-f]{32}$' AND p.proname <> keep
                AND p.pronargs = 0
                AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.refclassid = 'pg_proc'::regclass AND d.refobjid = p.oid)
              ORDER BY p.proname
    LOOP
        IF pg_try_advisory_xact_lock(fence._gate_key('guard function ' || f.proname))
           AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.refclassid = 'pg_proc'::regclass AND d.refobjid = f.oid) THEN
            EXECUTE format('DROP FUNCTION IF EXISTS fence.%I()', f.proname);
        END IF;
    END LOOP;
END
$$;
COMMENT ON FUNCTION fence._drop_unused_guards(text) IS 'pgfence internal: drops the generated guard functions no trigger uses (but keep), under their creation locks';
REVOKE ALL ON FUNCTION fence._drop_unused_guards(text) FROM PUBLIC;

-- As in 008, and the unused guards dropped.
CREATE OR REPLACE FUNCTION fence._guard_function(tbl regclass, col name) RETURNS regprocedure
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    fname text := '_guard_' || md5(col);
    fn    regprocedure;
    rl    name;
BEGIN
    PERFORM fence._guard_maker(tbl);
    PERFORM fence._columns_of(tbl, ARRAY[col]);
    -- concurrent first protects of one column name: one creates, the other waits
    PERFORM pg_advisory_xact_lock(fence._gate_key('guard function ' || fname));
    PERFORM fence._drop_unused_guards(fname);
    fn := to_regprocedure(format('fence.%I()', fname));
    EXECUTE format('CREATE OR REPLACE FUNCTION fence.%I() RETURNS trigger LANGUAGE plpgsql VOLATILE AS %L', fname, fence._guard_source(col));
    IF fn IS NULL THEN
        EXECUTE format('COMMENT ON FUNCTION fence.%I() IS %L', fname,
                       format('pgfence row guard of tables whose token column is %I (body: fence._guard_source(%L))', col, col));
        EXECUTE format('REVOKE ALL ON FUNCTION fence.%I() FROM PUBLIC', fname);
        fn := format('fence.%I()', fname)::regprocedure;
        -- the roles granted fence.protect themselves (members inherit)
        FOR rl IN SELECT r.rolname FROM pg_roles r, pg_proc p, aclexplode(p.proacl) x
                   WHERE p.oid = 'fence.protect(regclass, text, name)'::regprocedure
                     AND x.grantee = r.oid AND x.privilege_type = 'EXECUTE' LOOP
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', fn, rl);
        END LOOP;
    END IF;
    RETURN fn;
END
$$;

-- As in 008, and the unused guards dropped.
CREATE OR REPLACE FUNCTION fence._rows_function(tbl regclass, rcol name, tcol name) RETURNS regprocedure
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    fname text := '_rows_' || md5(format('%I,%s', rcol, coalesce(quote_ident(tcol), '')));
    fn    regprocedure;
    rl    name;
BEGIN
    PERFORM fence._guard_maker(tbl);
    PERFORM fence._columns_of(tbl, ARRAY[rcol, tcol]);
    PERFORM pg_advisory_xact_lock(fence._gate_key('guard function ' || fname));
    PERFORM fence._drop_unused_guards(fname);
    fn := to_regprocedure(format('fence.%I()', fname));
    EXECUTE format('CREATE OR REPLACE FUNCTION fence.%I() RETURNS trigger LANGUAGE plpgsql VOLATILE AS %L', fname, fence._rows_source(rcol, tcol));
    IF fn IS NULL THEN
        EXECUTE format('COMMENT ON FUNCTION fence.%I() IS %L', fname,
                       format('pgfence guard of per-row tables whose resource column is %I and token column %s (body: fence._rows_source(%L, %L))',
                              rcol, coalesce(quote_ident(tcol), 'none'), rcol, tcol));
        EXECUTE format('REVOKE ALL ON FUNCTION fence.%I() FROM PUBLIC', fname);
        fn := format('fence.%I()', fname)::regprocedure;
        FOR rl IN SELECT r.rolname FROM pg_roles r, pg_proc p, aclexplode(p.proacl) x
                   WHERE p.oid = 'fence.protect_rows(regclass, name, text, name)'::regprocedure
                     AND x.grantee = r.oid AND x.privilege_type = 'EXECUTE' LOOP
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', fn, rl);
        END LOOP;
    END IF;
    RETURN fn;
END
$$;

-- ---------------------------------------------------------------------------
-- 9. Version
-- ---------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION fence.version() RETURNS integer
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT 9 $$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA fence FROM PUBLIC;
SELECT fence._regrant_usage();
