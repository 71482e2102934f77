-- pgfence 009: every order (issue 31: the third review's five holes and the
-- interleaving tester; issue 29: per-row writes and the grant made leaner;
-- issue 28: rows a producer may create; issue 32: the counter's budget).
--
-- What changes, each with the test that failed on 008 (the proofs are in
-- docs/design.md; the reference in docs/sql.md):
--
-- 1. Every grant is a key update (lease_token_key UNIQUE (token)): a grant
--    in a savepoint after a top-level FOR KEY SHARE let older snapshots
--    commit under the superseded token (break 1;
--    TestGrantInASavepointAfterARowLockFailsOlderSnapshots, TestInterleavings).
-- 2. Epochs that see restores: a data-only reload into the same database and
--    a base backup started without recovery start a new epoch; the counter
--    moves only at a crash restart; fence.token_budget() (breaks 2 and 3;
--    TestDataOnlyReloadIntoTheSameDatabaseStartsANewEpoch,
--    TestBaseBackupStartedWithoutRecoveryAfterAPrimaryCrash,
--    TestPromotionDoesNotMoveTheCounter).
-- 3. Refusals in read-only transactions are counted (break 4;
--    TestRefusalsCountWritesThatTurnedReadOnlyOn).
-- 4. Generated guard functions are bounded by the triggers that use them
--    (break 5; TestGuardFunctionsAreBoundedByTheTriggersThatUseThem).
-- 5. The per-row guard checks every row in its own row trigger (issue 29),
--    and fence.allow_producers lets producers create rows of resources that
--    were never granted (issue 28; sqlfuncs/producers_test.go).
-- 6. fence.acquire grants a released or expired lease in one UPDATE (issue
--    29's grant).

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
--
-- Three changes to the epoch machinery of 006-008 (docs/design.md, "Why an
-- epoch, and where it comes from", "Restores the kit can see"):
--
-- a. A data-only reload into the same database (break 3) brought back
--    exactly the fence.origin row that says "home", so the next grant kept
--    the dump's epoch and the counter the dump's setval put back. The row
--    now names the transaction that wrote it twice: kit_xact, set by the
--    kit, and row_xact, a generated column that PostgreSQL computes from
--    the writing transaction whenever the row is inserted (COPY and INSERT
--    of a dump included; neither can supply it; an UPDATE leaves it). A reloaded row carries the
--    dump's kit_xact and the loader's row_xact, and is not at home. The
--    cache row gets the same pair, so that a reloaded cache row (pg_restore
--    --disable-triggers keeps the origin trigger from emptying it) is never
--    trusted (TestDataOnlyReloadIntoTheSameDatabaseStartsANewEpoch).
-- b. A base backup started without recovery (no recovery.signal) after its
--    primary crashed and kept granting (break 2) moved its counter 2^32
--    ahead from a lower value into the range the primary granted from after
--    its own crash. PostgreSQL renames the backup's backup_label to
--    backup_label.old when it starts from it; fence.origin records the
--    digest of that file (fence._backup_label()), and a server on the same
--    timeline whose file differs is not at home: its first grant starts a
--    new epoch. The file is read only where the kit's owner may execute
--    pg_read_file (superusers may); elsewhere the digest is unknown (NULL)
--    and such a restore takes the documented step DELETE FROM fence.origin
--    (fence.token_budget() says which: reads_backup_label)
--    (TestBaseBackupStartedWithoutRecoveryAfterAPrimaryCrash).
-- c. The counter moves 2^32 ahead only when the cache is empty and the
--    epoch stays what the state says (a crash restart): a grant that moves
--    to a new epoch (a promotion, a restore) is above every token of the
--    old one whatever its counter, and spends no move of the counter's
--    2047 (TestPromotionDoesNotMoveTheCounter). A move that would leave the
--    counter no room raises SQLSTATE 54000 instead of granting; and
--    fence.token_budget() says what is left of the epochs and the counter.

-- The top-level transaction id of the transaction running now. Declared
-- IMMUTABLE although it is not: a generated column must be, and this is
-- what makes fence.origin.row_xact and fence.epoch_cache.row_xact name the
-- transaction that stored the row, whoever stored it. Internal: for those
-- two columns only.
CREATE FUNCTION fence._row_xact() RETURNS xid8
LANGUAGE sql IMMUTABLE
AS $$ SELECT pg_catalog.pg_current_xact_id() $$;

-- The md5 of this server's backup_label.old, which PostgreSQL leaves in the
-- data directory of a server started from a base backup; '' when there is none; NULL when the role it runs as (the
-- kit's owner: it is called from fence._epoch and fence.token_budget) may
-- not execute pg_read_file (a non-superuser owner without GRANT EXECUTE ON
-- FUNCTION pg_read_file(text, bigint, bigint, boolean)), so the kit cannot
-- know.
CREATE FUNCTION fence._backup_label() RETURNS text
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    IF NOT pg_catalog.has_function_privilege('pg_catalog.pg_read_file(pg_catalog.text, pg_catalog.int8, pg_catalog.int8, pg_catalog.bool)', 'EXECUTE') THEN
        RETURN NULL;
    END IF;
    RETURN COALESCE(pg_catalog.md5(pg_catalog.pg_read_file('backup_label.old', 0, 1048576, true)), '');
END
$$;

-- The cache first: a file that was empty (no grant since the last crash
-- recovery) must stay empty, so that the next grant still moves the counter;
-- a file that was not must not become empty (the rewrite of ADD COLUMN ...
-- STORED keeps no dead row), or the upgrade would spend a move.
DO $$
DECLARE
    had boolean := pg_catalog.pg_relation_size('fence.epoch_cache'::pg_catalog.regclass) > 0;
BEGIN
    ALTER TABLE fence.epoch_cache
        ADD COLUMN kit_xact xid8,
        ADD COLUMN row_xact xid8 GENERATED ALWAYS AS (fence._row_xact()) STORED;
    DELETE FROM fence.epoch_cache;
    IF had THEN
        INSERT INTO fence.epoch_cache (system_identifier, datoid, relid, timeline, base) VALUES (0, 0, 0, 0, 0);
        DELETE FROM fence.epoch_cache;
    END IF;
END
$$;

ALTER TABLE fence.origin
    ADD COLUMN kit_xact xid8,
    ADD COLUMN row_xact xid8 GENERATED ALWAYS AS (fence._row_xact()) STORED,
    ADD COLUMN backup_label text;
-- Upgrading writes the current database as home, as 007 did: a reload or a
-- base backup started before the upgrade and never told apart cannot be
-- told apart now either.
-- (Stored again, not updated: an UPDATE does not recompute a generated
-- column that depends on no column.)
WITH old AS (DELETE FROM fence.origin RETURNING datoid, system_identifier)
INSERT INTO fence.origin (datoid, system_identifier, kit_xact, backup_label)
SELECT old.datoid, old.system_identifier, pg_catalog.pg_current_xact_id(), fence._backup_label() FROM old;

-- As in 008, and the row must have been written by the kit in the
-- transaction that stored it (kit_xact = row_xact).
CREATE OR REPLACE FUNCTION fence._cache_epoch(c fence.epoch_cache) RETURNS bigint
LANGUAGE sql VOLATILE
AS $$
    SELECT CASE WHEN c.system_identifier OPERATOR(pg_catalog.=) fence._system_identifier()
                 AND c.datoid OPERATOR(pg_catalog.=) fence._database_oid()
                 AND c.relid OPERATOR(pg_catalog.=) 'fence.epoch_state'::pg_catalog.regclass::pg_catalog.oid
                 AND c.timeline OPERATOR(pg_catalog.=) fence._timeline()
                 AND c.kit_xact OPERATOR(pg_catalog.=) c.row_xact
                 AND c.base OPERATOR(pg_catalog.+) c.timeline OPERATOR(pg_catalog.<) (1::pg_catalog.int8 OPERATOR(pg_catalog.<<) 20)
                 AND c.base OPERATOR(pg_catalog.+) c.timeline OPERATOR(pg_catalog.>=) pg_catalog.pg_sequence_last_value('fence.epoch_floor'::pg_catalog.regclass)
           THEN c.base OPERATOR(pg_catalog.+) c.timeline END
$$;

-- As in 008, with three changes: home also needs fence.origin's row to have
-- been written by the kit (kit_xact = row_xact) and, on the same timeline,
-- the digest of backup_label.old it recorded; the origin row is written
-- with both, and again at a promotion whose digest changed; and the counter
-- moves only when the epoch stays (a crash restart), never past what a
-- grant can still use.
CREATE OR REPLACE FUNCTION fence._epoch() RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    sysid bigint := fence._system_identifier();
    mydb  oid := fence._database_oid();
    myrel oid := 'fence.epoch_state'::pg_catalog.regclass::oid;
    tli   bigint := fence._timeline();
    label text := fence._backup_label();
    s     fence.epoch_state;
    home  boolean;
    same_label boolean;
    nbase bigint;
    floor bigint;
    last  bigint;
BEGIN
    IF NOT EXISTS (SELECT FROM fence.epoch_state) THEN
        -- First grant of this install, or of a restore that brought lease
        -- rows but no state: start past every stored token.
        INSERT INTO fence.epoch_state (system_identifier, relid, timeline, base)
        VALUES (sysid, myrel, tli, coalesce((SELECT max(l.token) >> 43 FROM fence.lease l), 0))
        ON CONFLICT DO NOTHING;
    END IF;
    SELECT * INTO s FROM fence.epoch_state FOR UPDATE;
    -- This transaction's commit is flushed before it returns, whatever
    -- synchronous_commit is at COMMIT: the counter's move and the new state
    -- are durable before any token above them is used.
    TRUNCATE fence.commit_flush;
    -- At home: exactly one row, written by the kit (the migration, or the
    -- last restore or promotion below) for this database of this cluster in
    -- the transaction that stored it; a row reloaded from a dump was stored
    -- by the loader.
    SELECT coalesce(count(*) = 1 AND bool_and(o.datoid = mydb AND o.system_identifier = sysid
                                              AND o.kit_xact = o.row_xact), false),
           coalesce(count(*) = 1 AND bool_and(o.backup_label IS NOT DISTINCT FROM label), false)
      INTO home, same_label FROM fence.origin o;
    IF s.system_identifier = sysid AND s.relid = myrel AND home AND s.timeline < tli THEN
        nbase := s.base;  -- promotion: the timeline alone moves the epoch up
        UPDATE fence.epoch_state SET timeline = tli;
        IF NOT same_label THEN
            -- a standby made from a base backup: its backup_label.old is
            -- home from now on
            DELETE FROM fence.origin;
            INSERT INTO fence.origin (datoid, system_identifier, kit_xact, backup_label)
            VALUES (mydb, sysid, pg_catalog.pg_current_xact_id(), label);
        END IF;
    ELSIF s.system_identifier <> sysid OR s.relid <> myrel OR NOT home OR s.timeline > tli
          OR NOT same_label THEN
        -- a restored copy (another cluster, another database, a template
        -- copy, a reload, a base backup started on the same timeline) or a
        -- timeline that went back: move past every epoch this data has seen
        nbase := greatest(s.base + s.timeline,
                          coalesce((SELECT max(l.token) >> 43 FROM fence.lease l), 0));
        UPDATE fence.epoch_state SET system_identifier = sysid, relid = myrel, timeline = tli, base = nbase;
        DELETE FROM fence.origin;
        INSERT INTO fence.origin (datoid, system_identifier, kit_xact, backup_label)
        VALUES (mydb, sysid, pg_catalog.pg_current_xact_id(), label);
    ELSE
        nbase := s.base;  -- just created, or another grant updated it while we waited
    END IF;
    floor := pg_catalog.pg_sequence_last_value('fence.epoch_floor'::pg_catalog.regclass);
    IF nbase + tli < floor THEN
        nbase := floor - tli;
        UPDATE fence.epoch_state SET base = nbase;
    END IF;
    IF nbase + tli >= (1::bigint << 20) THEN
        RAISE EXCEPTION 'pgfence: the token epochs are exhausted (epoch % of at most %)', nbase + tli, (1::bigint << 20) - 1
            USING ERRCODE = '54000',
                  HINT = 'the token layout allows 2^20 - 1 epochs (promotions and restores) in the life of an install; fence.token_budget() shows what is left; see docs/design.md';
    END IF;
    -- An empty cache file: crash recovery (or a promotion, or a restore of
    -- the files) emptied it, and grants made before may be lost with their
    -- commits, while their callers hold the tokens. In the same epoch they
    -- took at most one counter value each, and no crash loses 2^32 of them:
    -- the counter moves past them all. (setval is not rolled back; a
    -- rolled-back attempt leaves a dead row in the file, so a retry does
    -- not move it again.) A new epoch is above every token of the old one,
    -- whatever the counter: no move.
    IF pg_catalog.pg_relation_size('fence.epoch_cache'::pg_catalog.regclass) = 0
       AND nbase + tli <= s.base + s.timeline THEN
        SELECT c.last_value INTO last FROM fence.token_counter c;
        IF last >= 8796093022207 - 4294967296 THEN
            RAISE EXCEPTION 'pgfence: the token counter is exhausted: it cannot move past a crash again (counter %, at most %)', last, 8796093022207
                USING ERRCODE = '54000',
                      HINT = 'each crash restart moves the shared counter 2^32 ahead, 2047 times in the life of an install; fence.token_budget() shows what is left; see docs/design.md';
        END IF;
        PERFORM pg_catalog.setval('fence.token_counter', last + 4294967296);
    END IF;
    DELETE FROM fence.epoch_cache;
    INSERT INTO fence.epoch_cache (system_identifier, datoid, relid, timeline, base, kit_xact)
    VALUES (sysid, mydb, myrel, tli, nbase, pg_catalog.pg_current_xact_id());
    RETURN nbase + tli;
END
$$;

-- What is left of the token space (docs/sql.md, "fence.token_budget"),
-- read-only: the epoch of the stored state and the epochs left after it
-- (promotions and restores each take one), the counter's last value, the
-- grants and the crash restarts (moves of 2^32) it has room for, and
-- whether the kit can see a base backup started without recovery.
CREATE FUNCTION fence.token_budget(OUT epoch bigint, OUT epochs_left bigint, OUT counter bigint,
                                   OUT grants_left bigint, OUT counter_moves_left bigint,
                                   OUT reads_backup_label boolean) RETURNS record
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT e.epoch, (1::int8 << 20) - 1 - e.epoch,
           k.counter, 8796093022207 - k.counter,
           greatest(0, (8796093022207 - 1 - k.counter) / 4294967296),
           fence._backup_label() IS NOT NULL
      FROM (SELECT coalesce((SELECT s.base + s.timeline FROM fence.epoch_state s), 0) AS epoch) e,
           (SELECT CASE WHEN c.is_called THEN c.last_value ELSE c.last_value - 1 END AS counter
              FROM fence.token_counter c) k
$$;
COMMENT ON FUNCTION fence.token_budget() IS 'what is left of the token space: the epoch and the epochs left (promotions, restores), the counter, the grants and the crash restarts (counter moves of 2^32) left, and whether the kit can see a base backup started without recovery';

-- fence.token_budget() is granted to usage roles by section 5's fence.grant_usage
-- (the one copy of it in this migration).

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
-- 6. The grant made leaner (issue 29)
-- ---------------------------------------------------------------------------

-- fence.acquire grants a TTL lease whose row exists and is not live in two
-- statements and no nested call: the unlocked read of 008 (a live lease is
-- busy at once, without a lock: pollers never queue), the gate tried in a
-- subtransaction of its own, and one UPDATE that locks the row FOR UPDATE
-- SKIP LOCKED at its own level (an InitPlan of the same statement) and
-- writes the next token. Everything else goes to fence._grant as before:
-- no lease row yet (the first grant inserts), the epoch cache not valid
-- (fence._epoch decides), the gate taken, the row locked (a renewal, a
-- release, a large per-row statement's key-share lock: the bounded wait),
-- the row live again, a token not above the row's (a grant in a newer
-- epoch committed between the read and the gate: fence._next_token raises
-- the floor), the counter past its last value (54000 there).
--
-- Why it is the same grant (docs/design.md, "Why no stale write commits",
-- G1): the gate is held exclusive before the row changes, in a
-- subtransaction that commits into the caller's level (F1); the row is
-- locked FOR UPDATE and updated in one statement of the same (sub)transaction
-- as the gate's holder, and the update writes token, a key update (F3,
-- section 1), so every writer's FOR KEY SHARE conflicts with it; the token
-- is epoch << 43 | nextval of the shared counter, with the epoch read from
-- the validated cache exactly as fence._grant reads it, and the UPDATE only
-- writes it when it is above the locked row's token (the next counter value
-- exceeds the last one), and refuses a counter past its range, the two
-- conditions fence._next_token checks. The shared tool's
-- grant scenario (acquire + release): 583 k instructions on 008, 464 k.
-- As in 002, with the fast path above first.
CREATE OR REPLACE FUNCTION fence.acquire(resource text, holder text, ttl interval, waiting boolean DEFAULT false) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    secs    double precision := pg_catalog.date_part('epoch', ttl);
    r       record;
    gate    boolean;
    now     timestamptz;
    t       bigint;
    durable text;  -- assigned, not PERFORMed: see fence._force_durable
BEGIN
    IF fence._name_ok(resource) AND fence._name_ok(holder) AND fence._ttl_ok(secs) THEN
        SELECT fence._cache_epoch(c) AS epoch, fence._live(x, pg_catalog.clock_timestamp()) AS live, x.waiters INTO r
          FROM fence.epoch_cache c JOIN fence.lease x ON x.resource = resource;
        IF r.live AND (NOT coalesce(waiting, false) OR r.waiters) THEN
            RETURN NULL;  -- live: busy at once, without a lock, as in fence._grant
        END IF;
        IF r.epoch IS NOT NULL AND NOT r.live THEN
            durable := fence._force_durable();
            BEGIN  -- a subtransaction of its own, as every gate
                gate := pg_catalog.pg_try_advisory_xact_lock(fence._gate_key(resource));
            EXCEPTION WHEN OTHERS THEN
                RAISE;
            END;
            IF gate THEN
                now := pg_catalog.clock_timestamp();
                -- nextval only for the row it is written to (no counter
                -- value spent on a fall-back); the next value is above the
                -- last one, so the WHERE's bound is the written token's.
                UPDATE fence.lease x
                   SET token = (r.epoch << 43) | pg_catalog.nextval('fence.token_counter'), holder = holder, kind = 'ttl',
                       acquired_at = now, expires_at = now + pg_catalog.make_interval(secs => secs), ended_at = NULL,
                       session_pid = NULL, waiters = false
                 WHERE x.resource = (SELECT y.resource FROM fence.lease y WHERE y.resource = resource FOR UPDATE SKIP LOCKED)
                   AND x.token < ((r.epoch << 43) | (pg_catalog.pg_sequence_last_value('fence.token_counter') + 1))
                   AND NOT fence._live(x, now)
                RETURNING x.token INTO t;
                IF t >> 43 = r.epoch THEN
                    RETURN t;
                ELSIF t IS NOT NULL THEN
                    -- the counter ran past 2^43 - 1 into the epoch's bits:
                    -- refused as fence._next_token refuses it (the update
                    -- goes with the error)
                    RAISE EXCEPTION 'pgfence: the token counter is exhausted in epoch %', r.epoch
                        USING ERRCODE = '54000', HINT = 'the token layout allows 2^43 - 1 grants per epoch across all resources; see docs/design.md';
                END IF;
            END IF;
        END IF;
        RETURN fence._grant(resource, holder, 'ttl', pg_catalog.make_interval(secs => secs), false, coalesce(waiting, false));
    END IF;
    PERFORM fence._check_name('resource', resource);
    PERFORM fence._check_name('holder', holder);
    RETURN fence._grant(resource, holder, 'ttl', fence._check_ttl(ttl), false, coalesce(waiting, false));
END
$$;

-- ---------------------------------------------------------------------------
-- 5. Per-row guard and producers (issue 29; issue 28 item 3)
-- ---------------------------------------------------------------------------
--
-- Every row of a per-row table is checked in its own BEFORE row trigger
-- ("~fence_guard_1_row"): no transition tables, no statement guard to skip,
-- no mark that a statement's rows were all checked. The check locks the
-- resource's lease row FOR KEY SHARE and compares the token in one
-- statement (fence._lock_check); a grant locks that row FOR UPDATE (and
-- polls with SKIP LOCKED while a writer holds it), so no grant commits
-- while a writer that passed is open, and a writer that comes after a
-- grant's lock waits for it and reads the new token (READ COMMITTED
-- follows the update; a snapshot transaction fails 40001), as 008's
-- fence._check_many argued for large statements. Row locks take no entry in
-- the lock table, so a statement of any size stays in the lock budget.
-- Everything that is not that one-statement pass goes to fence._rows_slow.
-- A BEFORE statement trigger ("~fence_rows_2_kids") refuses writes while
-- the table has inheritance children, whose rows its row triggers never
-- see (TestRowsChildTableCreatedLater). docs/design.md, "Per-row
-- resources".
--
-- The generated functions have new names (md5 of '9:' and the columns), so
-- tables that 008's functions guard keep working until re-protected; this
-- migration re-protects the per-row tables that the migrating role owns and
-- names the others in a WARNING (their owner runs fence.protect_rows again).
--
-- Producers (fence.allow_producers, off by default): an INSERT without a
-- token of a row whose resource has no lease row is accepted; see
-- fence._rows_slow for the argument.

-- Locks the lease row of res (FOR KEY SHARE) and says whether tok is its
-- token: true (the fast path), false or NULL (no lease row, or tok NULL).
-- PL/pgSQL, not SQL: PostgreSQL before 18 plans a SQL function's query
-- again in every transaction, where PL/pgSQL keeps its plan.
CREATE FUNCTION fence._lock_check(res text, tok bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ok boolean;
BEGIN
    SELECT x.token = tok INTO ok FROM fence.lease x WHERE x.resource = res FOR KEY SHARE;
    RETURN ok;
END
$$;

-- The per-row guard's slow path: the acting role, a NULL resource, the
-- producer's path, a missing token (FN002), and the full check with its
-- refusals (fence._check_many, which locks the row as the fast path does).
--
-- Producers, and why they are sound at READ COMMITTED only. A producer's
-- INSERT carries no token; it is accepted when the resource has no lease
-- row, that is, was never granted (a revoke or any grant leaves a row that
-- is never deleted), so guarantee 2 and 3 hold for every resource that was
-- ever granted: a stale holder inserting without a token finds the lease
-- row and is refused FN002, with its stale token FN001. The race is with a
-- first grant: the producer takes the resource's gate in share mode and
-- then reads fence.lease with a new snapshot. Every grant holds the gate
-- exclusively from before it inserts the lease row until it commits
-- (fence._lock_lease), so either the grant committed before the producer's
-- gate, and the read sees its row (refused), or it cannot commit before
-- the producer ends, and its holder then finds the producer's row as any
-- row created before the lease. Under REPEATABLE READ or SERIALIZABLE the
-- read uses the transaction's snapshot, which may predate a grant that
-- committed before the gate: there the producer is refused (FN002). The
-- gates count against the transaction's budget of 64 (fence._gates, shared
-- with 008's guards), so a transaction creates rows of at most 64 new
-- resources this way; past it, FN002.
CREATE FUNCTION fence._rows_slow(res text, tok bigint, op text, rel oid, producers boolean, old_row boolean) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    held integer;
    why  text;
BEGIN
    IF CURRENT_USER <> fence._acting_role() THEN
        PERFORM fence._acting_role_check(rel);
    END IF;
    IF res IS NULL AND NOT old_row THEN
        -- before the NOT NULL constraint would say it (a later BEFORE
        -- trigger could still change the row)
        RAISE EXCEPTION 'pgfence: a row of % has no resource: its resource column is NULL', rel::regclass
            USING ERRCODE = '23502', HINT = 'every row of a per-row table names its resource';
    ELSIF res IS NULL THEN
        PERFORM fence._refuse('FN003', format('pgfence: a row of %s has no resource: its resource column is NULL', rel::regclass),
            'resource=NULL', 'declare the resource column NOT NULL');
    END IF;
    IF tok IS NULL AND producers AND op = 'INSERT' THEN
        IF current_setting('transaction_isolation') <> 'read committed' THEN
            why := 'a producer inserts under READ COMMITTED only';
        ELSE
            held := CASE WHEN current_setting('fence._gates', true) ~ '^[0-9]{1,4}$' THEN current_setting('fence._gates', true)::integer
                         WHEN coalesce(current_setting('fence._gates', true), '') = '' THEN 0
                         ELSE 64 END;
            IF held >= 64 THEN
                why := 'a transaction creates rows of at most 64 new resources without tokens';
            ELSE
                BEGIN  -- a subtransaction of its own, as in fence._check
                    PERFORM pg_advisory_xact_lock_shared(fence._gate_key(res));
                EXCEPTION WHEN OTHERS THEN
                    RAISE;
                END;
                PERFORM set_config('fence._gates', (held + 1)::text, true);
                IF NOT EXISTS (SELECT FROM fence.lease x WHERE x.resource = res) THEN
                    RETURN;
                END IF;
                why := 'the resource was granted before, so only its holder may create its rows';
            END IF;
        END IF;
        PERFORM fence._refuse('FN002',
            format('pgfence: no fencing token for INSERT on protected table %s: %s', rel::regclass, why),
            format('resource=%s token=NULL', res),
            format('acquire %L and assign its token in the statement, or call fence.use_token(%L, token) earlier in this transaction', res, res));
    END IF;
    IF tok IS NULL THEN
        PERFORM fence._registered_token(res, op, rel);
    END IF;
    PERFORM fence._check_many(ARRAY[res], ARRAY[tok], op, rel);
END
$$;

-- Refuses a write to a per-row table with inheritance children. Like the
-- row guards it runs with the writer's rights and its search_path, and
-- qualifies every name and operator (a pinned search_path costs a third of
-- its call).
CREATE FUNCTION fence._rows_kids() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_inherits i WHERE i.inhparent OPERATOR(pg_catalog.=) TG_RELID) THEN
        RAISE EXCEPTION 'pgfence: per-row protected table % has inheritance children', TG_RELID::pg_catalog.regclass
            USING ERRCODE = '42809',
                  HINT = 'the guard does not see the children''s rows as they are written: drop the children (or ALTER TABLE ... NO INHERIT), or fence.unprotect the table';
    END IF;
    RETURN NULL;
END
$$;

-- The bodies of a per-row guard: the row trigger's (fence._rows9_source)
-- and, with a token column, the mark trigger's (fence._rows9_mark_source),
-- in functions of their own so that each call evaluates only what its path
-- needs (in PL/pgSQL every expression costs about 4 k instructions in a new
-- transaction). Trigger arguments: prefix, token column ('' for none),
-- resource column, and 'producers' when fence.allow_producers is on.
CREATE FUNCTION fence._rows9_source(rcol name, tcol name) RETURNS text
LANGUAGE sql IMMUTABLE
AS $f$
    SELECT pg_catalog.format(CASE WHEN tcol IS NOT NULL THEN
$s$
DECLARE
    res pg_catalog.text;
    tok pg_catalog.int8;
    was pg_catalog.text;
BEGIN
    IF TG_OP OPERATOR(pg_catalog.=) 'UPDATE' THEN
        res := (TG_ARGV[0] OPERATOR(pg_catalog.||) NEW.%1$I::pg_catalog.text) COLLATE pg_catalog."C";
        IF NEW.%2$I OPERATOR(pg_catalog.<) 0 AND (OLD.%2$I IS NULL OR NEW.%2$I OPERATOR(pg_catalog.<>) OLD.%2$I) THEN
            NEW.%2$I := OPERATOR(pg_catalog.-) NEW.%2$I;  -- presented (marked by the mark trigger)
        ELSE
            NEW.%2$I := (CASE WHEN pg_catalog.current_setting('fence.tokens', true) OPERATOR(pg_catalog.<>) '' THEN pg_catalog.current_setting('fence.tokens', true)::pg_catalog.jsonb END OPERATOR(pg_catalog.->>) res)::pg_catalog.int8;
        END IF;
        IF fence._lock_check(res, NEW.%2$I) IS NOT TRUE OR CURRENT_USER OPERATOR(pg_catalog.<>) fence._acting_role() THEN
            PERFORM fence._rows_slow(res, NEW.%2$I, TG_OP, TG_RELID, false, false);
        END IF;
        -- a row moved to another resource needs the old one's token too
        -- (registered with fence.use_token)
        IF ((TG_ARGV[0] OPERATOR(pg_catalog.||) OLD.%1$I::pg_catalog.text) COLLATE pg_catalog."C" OPERATOR(pg_catalog.=) res) IS NOT TRUE THEN
            was := (TG_ARGV[0] OPERATOR(pg_catalog.||) OLD.%1$I::pg_catalog.text) COLLATE pg_catalog."C";
            tok := (CASE WHEN pg_catalog.current_setting('fence.tokens', true) OPERATOR(pg_catalog.<>) '' THEN pg_catalog.current_setting('fence.tokens', true)::pg_catalog.jsonb END OPERATOR(pg_catalog.->>) was)::pg_catalog.int8;
            IF fence._lock_check(was, tok) IS NOT TRUE OR CURRENT_USER OPERATOR(pg_catalog.<>) fence._acting_role() THEN
                PERFORM fence._rows_slow(was, tok, TG_OP, TG_RELID, false, true);
            END IF;
        END IF;
        RETURN NEW;
    ELSIF TG_OP OPERATOR(pg_catalog.=) 'INSERT' THEN
        res := (TG_ARGV[0] OPERATOR(pg_catalog.||) NEW.%1$I::pg_catalog.text) COLLATE pg_catalog."C";
        IF NEW.%2$I IS NULL THEN
            NEW.%2$I := (CASE WHEN pg_catalog.current_setting('fence.tokens', true) OPERATOR(pg_catalog.<>) '' THEN pg_catalog.current_setting('fence.tokens', true)::pg_catalog.jsonb END OPERATOR(pg_catalog.->>) res)::pg_catalog.int8;
        END IF;
        IF fence._lock_check(res, NEW.%2$I) IS NOT TRUE OR CURRENT_USER OPERATOR(pg_catalog.<>) fence._acting_role() THEN
            PERFORM fence._rows_slow(res, NEW.%2$I, TG_OP, TG_RELID, TG_NARGS OPERATOR(pg_catalog.>) 3, false);
        END IF;
        RETURN NEW;
    END IF;
    res := (TG_ARGV[0] OPERATOR(pg_catalog.||) OLD.%1$I::pg_catalog.text) COLLATE pg_catalog."C";
    tok := (CASE WHEN pg_catalog.current_setting('fence.tokens', true) OPERATOR(pg_catalog.<>) '' THEN pg_catalog.current_setting('fence.tokens', true)::pg_catalog.jsonb END OPERATOR(pg_catalog.->>) res)::pg_catalog.int8;
    IF fence._lock_check(res, tok) IS NOT TRUE OR CURRENT_USER OPERATOR(pg_catalog.<>) fence._acting_role() THEN
        PERFORM fence._rows_slow(res, tok, TG_OP, TG_RELID, false, true);
    END IF;
    RETURN OLD;
END
$s$
        ELSE
$s$
DECLARE
    res pg_catalog.text;
    tok pg_catalog.int8;
    was pg_catalog.text;
BEGIN
    IF TG_OP OPERATOR(pg_catalog.=) 'DELETE' THEN
        res := (TG_ARGV[0] OPERATOR(pg_catalog.||) OLD.%1$I::pg_catalog.text) COLLATE pg_catalog."C";
        tok := (CASE WHEN pg_catalog.current_setting('fence.tokens', true) OPERATOR(pg_catalog.<>) '' THEN pg_catalog.current_setting('fence.tokens', true)::pg_catalog.jsonb END OPERATOR(pg_catalog.->>) res)::pg_catalog.int8;
        IF fence._lock_check(res, tok) IS NOT TRUE OR CURRENT_USER OPERATOR(pg_catalog.<>) fence._acting_role() THEN
            PERFORM fence._rows_slow(res, tok, TG_OP, TG_RELID, false, true);
        END IF;
        RETURN OLD;
    END IF;
    res := (TG_ARGV[0] OPERATOR(pg_catalog.||) NEW.%1$I::pg_catalog.text) COLLATE pg_catalog."C";
    tok := (CASE WHEN pg_catalog.current_setting('fence.tokens', true) OPERATOR(pg_catalog.<>) '' THEN pg_catalog.current_setting('fence.tokens', true)::pg_catalog.jsonb END OPERATOR(pg_catalog.->>) res)::pg_catalog.int8;
    IF fence._lock_check(res, tok) IS NOT TRUE OR CURRENT_USER OPERATOR(pg_catalog.<>) fence._acting_role() THEN
        PERFORM fence._rows_slow(res, tok, TG_OP, TG_RELID, TG_OP OPERATOR(pg_catalog.=) 'INSERT' AND TG_NARGS OPERATOR(pg_catalog.>) 3, false);
    END IF;
    IF TG_OP OPERATOR(pg_catalog.=) 'UPDATE' THEN
        -- a row moved to another resource needs the old one's token too
        -- (registered with fence.use_token)
        IF ((TG_ARGV[0] OPERATOR(pg_catalog.||) OLD.%1$I::pg_catalog.text) COLLATE pg_catalog."C" OPERATOR(pg_catalog.=) res) IS NOT TRUE THEN
            was := (TG_ARGV[0] OPERATOR(pg_catalog.||) OLD.%1$I::pg_catalog.text) COLLATE pg_catalog."C";
            tok := (CASE WHEN pg_catalog.current_setting('fence.tokens', true) OPERATOR(pg_catalog.<>) '' THEN pg_catalog.current_setting('fence.tokens', true)::pg_catalog.jsonb END OPERATOR(pg_catalog.->>) was)::pg_catalog.int8;
            IF fence._lock_check(was, tok) IS NOT TRUE OR CURRENT_USER OPERATOR(pg_catalog.<>) fence._acting_role() THEN
                PERFORM fence._rows_slow(was, tok, TG_OP, TG_RELID, false, true);
            END IF;
        END IF;
    END IF;
    RETURN NEW;
END
$s$
        END, rcol, tcol)
$f$;

-- The mark trigger's body (BEFORE UPDATE OF the token column): a token
-- assigned in the statement is presented, and marked by its sign for the
-- row trigger; a foreign-key action's assignment of the row's own value is
-- not a presentation (as in fence._guard_source).
CREATE FUNCTION fence._rows9_mark_source(rcol name, tcol name) RETURNS text
LANGUAGE sql IMMUTABLE
AS $f$
    SELECT CASE WHEN tcol IS NOT NULL THEN pg_catalog.format($s$
BEGIN
    IF NEW.%2$I OPERATOR(pg_catalog.>) 0
       AND (NEW.%2$I OPERATOR(pg_catalog.<>) OLD.%2$I OR OLD.%2$I IS NULL OR pg_catalog.pg_trigger_depth() OPERATOR(pg_catalog.=) 1) THEN
        NEW.%2$I := OPERATOR(pg_catalog.-) NEW.%2$I;
        RETURN NEW;
    END IF;
    IF NEW.%2$I OPERATOR(pg_catalog.=) OLD.%2$I AND pg_catalog.pg_trigger_depth() OPERATOR(pg_catalog.>) 1 THEN
        RETURN NEW;
    END IF;
    IF NEW.%2$I OPERATOR(pg_catalog.<=) 0 THEN
        PERFORM fence.check((TG_ARGV[0] OPERATOR(pg_catalog.||) NEW.%1$I::pg_catalog.text) COLLATE pg_catalog."C", NEW.%2$I);
    END IF;
    NEW.%2$I := OPERATOR(pg_catalog.-) NEW.%2$I;
    RETURN NEW;
END
$s$, rcol, tcol) END
$f$;

-- As fence._rows_function, with the body of fence._rows9_source under a
-- name of its own ('9:' in the md5), so 008's functions stay for the tables
-- they guard.
CREATE FUNCTION fence._rows9_function(tbl regclass, rcol name, tcol name) RETURNS regprocedure
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    g     record;
    fn    regprocedure;
    rl    name;
BEGIN
    PERFORM fence._guard_maker(tbl);
    PERFORM fence._columns_of(tbl, ARRAY[rcol, tcol]);
    -- both creation locks, then the unused generated functions dropped (as
    -- section 4 does in fence._rows_function) but the row guard's: an
    -- unused mark function is dropped and made again below
    PERFORM pg_advisory_xact_lock(fence._gate_key('guard function ' || '_rows_' || md5(format('%s:%I,%s', v.k, rcol, coalesce(quote_ident(tcol), '')))))
       FROM (VALUES ('9'), ('9m')) v(k) WHERE v.k = '9' OR tcol IS NOT NULL ORDER BY v.k;
    PERFORM fence._drop_unused_guards('_rows_' || md5(format('9:%I,%s', rcol, coalesce(quote_ident(tcol), ''))));
    FOR g IN SELECT v.k, '_rows_' || md5(format('%s:%I,%s', v.k, rcol, coalesce(quote_ident(tcol), ''))) AS fname,
                    CASE v.k WHEN '9' THEN fence._rows9_source(rcol, tcol) ELSE fence._rows9_mark_source(rcol, tcol) END AS src,
                    CASE v.k WHEN '9' THEN 'guard' ELSE 'mark trigger' END AS what,
                    CASE v.k WHEN '9' THEN '_rows9_source' ELSE '_rows9_mark_source' END AS body
               FROM (VALUES ('9'), ('9m')) v(k)
              WHERE v.k = '9' OR tcol IS NOT NULL
              ORDER BY v.k DESC LOOP
        PERFORM pg_advisory_xact_lock(fence._gate_key('guard function ' || g.fname));
        fn := to_regprocedure(format('fence.%I()', g.fname));
        EXECUTE format('CREATE OR REPLACE FUNCTION fence.%I() RETURNS trigger LANGUAGE plpgsql VOLATILE AS %L', g.fname, g.src);
        IF fn IS NULL THEN
            EXECUTE format('COMMENT ON FUNCTION fence.%I() IS %L', g.fname,
                           format('pgfence %s of per-row tables whose resource column is %I and token column %s (body: fence.%s(%L, %L))',
                                  g.what, rcol, coalesce(quote_ident(tcol), 'none'), g.body, rcol, tcol));
            EXECUTE format('REVOKE ALL ON FUNCTION fence.%I() FROM PUBLIC', g.fname);
            fn := format('fence.%I()', g.fname)::regprocedure;
            FOR rl IN SELECT r.rolname FROM pg_roles r, pg_proc p, aclexplode(p.proacl) x
                       WHERE p.oid = 'fence.protect_rows(regclass, name, text, name)'::regprocedure
                         AND x.grantee = r.oid AND x.privilege_type = 'EXECUTE' LOOP
                EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', fn, rl);
            END LOOP;
        END IF;
    END LOOP;
    RETURN format('fence.%I()', '_rows_' || md5(format('9:%I,%s', rcol, coalesce(quote_ident(tcol), ''))))::regprocedure;
END
$$;

-- Creates the per-row guard triggers of tbl (its old ones dropped),
-- producers on or off.
CREATE FUNCTION fence._rows9_triggers(tbl regclass, qn text, fn regprocedure, rcol name, pre text, tcol name, producers boolean) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    tc     text := coalesce(tcol, '');
    always boolean;
BEGIN
    always := EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = tbl AND t.tgenabled = 'A'
                         AND t.tgname IN (SELECT fence._guard_triggers(tbl)));
    PERFORM fence._drop_guards(tbl, qn);
    IF tcol IS NOT NULL THEN
        EXECUTE format('CREATE TRIGGER "~fence_guard_0_mark" BEFORE UPDATE OF %I ON %s FOR EACH ROW EXECUTE FUNCTION fence.%I(%L, %L, %L)',
                       tcol, qn, '_rows_' || md5(format('9m:%I,%s', rcol, quote_ident(tcol))), pre, tc, rcol);
    END IF;
    IF producers THEN
        EXECUTE format('CREATE TRIGGER "~fence_guard_1_row" BEFORE INSERT OR UPDATE OR DELETE ON %s FOR EACH ROW EXECUTE FUNCTION %s(%L, %L, %L, %L)',
                       qn, fn::regproc, pre, tc, rcol, 'producers');
    ELSE
        EXECUTE format('CREATE TRIGGER "~fence_guard_1_row" BEFORE INSERT OR UPDATE OR DELETE ON %s FOR EACH ROW EXECUTE FUNCTION %s(%L, %L, %L)',
                       qn, fn::regproc, pre, tc, rcol);
    END IF;
    -- UPDATE and DELETE only: an INSERT into the table never writes a child.
    EXECUTE format('CREATE TRIGGER "~fence_rows_2_kids" BEFORE UPDATE OR DELETE ON %s FOR EACH STATEMENT EXECUTE FUNCTION fence._rows_kids(%L, %L, %L)',
                   qn, pre, tc, rcol);
    -- Never fires: it makes the columns a dependency of a trigger, so that
    -- ALTER COLUMN ... TYPE (which would change the resource names the
    -- guard computes) is refused while the table is protected.
    EXECUTE format('CREATE TRIGGER "~fence_rows_3_cols" AFTER UPDATE OF %s ON %s FOR EACH STATEMENT WHEN (false) EXECUTE FUNCTION fence._rows_kids(%L, %L, %L)',
                   concat_ws(', ', quote_ident(rcol), quote_ident(tcol)), qn, pre, tc, rcol);
    EXECUTE format('CREATE TRIGGER zz_fence_guard_stmt BEFORE TRUNCATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION fence._rows_truncate(%L, %L, %L)',
                   qn, pre, tc, rcol);
    IF always THEN
        PERFORM fence.fire_always(tbl, true);
    END IF;
END
$$;

-- As in 008, with the triggers of section 5 (a re-protect keeps the
-- producers setting).
CREATE OR REPLACE FUNCTION fence.protect_rows(tbl regclass, resource_column name, resource_prefix text DEFAULT '', token_column name DEFAULT NULL) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    qn     text;
    fn     regprocedure;
    a      record;
    prod   boolean;
BEGIN
    qn := fence._owned_table(tbl, 'protect_rows');
    IF resource_prefix IS NULL THEN
        RAISE EXCEPTION 'pgfence: resource_prefix must not be NULL' USING ERRCODE = '22004', HINT = 'pass '''' for no prefix';
    END IF;
    IF char_length(resource_prefix) > 200 THEN
        RAISE EXCEPTION 'pgfence: resource_prefix is % characters long; the limit is 200', char_length(resource_prefix)
            USING ERRCODE = '22001', HINT = 'resource names are at most 255 characters, prefix included';
    END IF;
    PERFORM fence._protectable(tbl);
    IF resource_column IS NULL THEN
        RAISE EXCEPTION 'pgfence: resource_column must not be NULL' USING ERRCODE = '22004', HINT = 'pass the column that names each row''s resource';
    END IF;
    SELECT x.atttypid, x.attnotnull, x.attgenerated INTO a FROM pg_attribute x
     WHERE x.attrelid = tbl AND x.attname = resource_column AND x.attnum > 0 AND NOT x.attisdropped;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgfence: column % of table % does not exist', resource_column, tbl
            USING ERRCODE = '42703', HINT = 'pass the column that names each row''s resource (for example its primary key)';
    END IF;
    IF a.atttypid NOT IN ('int2'::regtype::oid, 'int4'::regtype::oid, 'int8'::regtype::oid, 'text'::regtype::oid, 'varchar'::regtype::oid, 'uuid'::regtype::oid) THEN
        RAISE EXCEPTION 'pgfence: resource column % of table % has type %', resource_column, tbl, a.atttypid::regtype
            USING ERRCODE = '42804', HINT = 'use a column of type smallint, integer, bigint, text, varchar or uuid';
    END IF;
    IF a.attgenerated <> '' THEN
        RAISE EXCEPTION 'pgfence: resource column % of table % is a generated column', resource_column, tbl
            USING ERRCODE = '42809', HINT = 'BEFORE triggers see generated columns before they are computed: use a plain column';
    END IF;
    IF NOT a.attnotnull THEN
        RAISE EXCEPTION 'pgfence: resource column % of table % may be NULL', resource_column, tbl
            USING ERRCODE = '42P16', HINT = format('ALTER TABLE %s ALTER COLUMN %I SET NOT NULL', qn, resource_column);
    END IF;
    IF token_column IS NOT NULL THEN
        IF token_column = resource_column THEN
            RAISE EXCEPTION 'pgfence: the token column and the resource column of % are both %', tbl, resource_column
                USING ERRCODE = '42P16', HINT = 'keep the token in a bigint column of its own';
        END IF;
        PERFORM fence._check_token_column(tbl, qn, token_column);
    END IF;
    fn := fence._rows9_function(tbl, resource_column, token_column);
    prod := EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = tbl AND t.tgname = '~fence_guard_1_row' AND t.tgnargs = 4
                       AND fence._trigger_arg(t.tgargs, 3) = 'producers');
    PERFORM fence._rows9_triggers(tbl, qn, fn, resource_column, resource_prefix, token_column, prod);
    IF token_column IS NOT NULL THEN
        PERFORM fence._floor_from_column(tbl, qn, token_column);
    END IF;
END
$$;
COMMENT ON FUNCTION fence.protect_rows(regclass,name,text,name) IS 'guards tbl per row: a write must present the latest token of resource_prefix || resource_column of every row it writes';

-- Producers on or off for a per-row table (its owner only).
CREATE FUNCTION fence.allow_producers(tbl regclass, enabled boolean) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    qn text := fence._owned_table(tbl, 'allow_producers');
    g  record;
BEGIN
    IF enabled IS NULL THEN
        RAISE EXCEPTION 'pgfence: enabled must not be NULL' USING ERRCODE = '22004', HINT = 'pass true (producers may insert rows of never-granted resources) or false';
    END IF;
    SELECT t.tgfoid::regprocedure AS fn, fence._trigger_arg(t.tgargs, 0) AS pre,
           nullif(fence._trigger_arg(t.tgargs, 1), '')::name AS tcol, fence._trigger_arg(t.tgargs, 2)::name AS rcol
      INTO g FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
     WHERE t.tgrelid = tbl AND t.tgname = '~fence_guard_1_row' AND t.tgnargs >= 3
       AND p.pronamespace = 'fence'::regnamespace AND p.prosrc = fence._rows9_source(fence._trigger_arg(t.tgargs, 2)::name, nullif(fence._trigger_arg(t.tgargs, 1), '')::name);
    IF g.fn IS NULL THEN
        RAISE EXCEPTION 'pgfence: % is not guarded per row by this version of the kit', tbl
            USING ERRCODE = '55000', HINT = 'run fence.protect_rows on it first (again, if it was protected before migration 9)';
    END IF;
    PERFORM fence._guard_maker(tbl);
    PERFORM fence._rows9_triggers(tbl, qn, g.fn, g.rcol, g.pre, g.tcol, enabled);
END
$$;
COMMENT ON FUNCTION fence.allow_producers(regclass,boolean) IS 'lets an INSERT into per-row table tbl without a token create the row of a resource that was never granted (READ COMMITTED), or not (enabled => false, the default)';

-- As in 008, recognising both trigger sets: 008's ("~fence_rows_2_upd")
-- and this migration's (a "~fence_guard_1_row" with three or four
-- arguments).
CREATE OR REPLACE VIEW fence.protected AS
SELECT t.tgrelid::regclass AS tbl,
       fence._trigger_arg(t.tgargs, 0) AS resource,
       (CASE WHEN pg_catalog.bool_or(t.tgname = '~fence_rows_2_upd' OR (t.tgname = '~fence_guard_1_row' AND t.tgnargs >= 3))
             THEN NULLIF(max(fence._trigger_arg(t.tgargs, 1)) FILTER (WHERE t.tgname = '~fence_rows_2_upd' OR (t.tgname = '~fence_guard_1_row' AND t.tgnargs >= 3)), '')
             ELSE max(fence._trigger_arg(t.tgargs, 1)) FILTER (WHERE t.tgname IN ('zz_fence_guard_row', '~fence_guard_1_row')) END)::name AS token_column,
       (SELECT pg_catalog.array_agg(r.rolname ORDER BY r.rolname)
          FROM pg_catalog.pg_roles r, pg_catalog.pg_class c
         WHERE c.oid = t.tgrelid
           AND NOT r.rolsuper
           AND NOT pg_catalog.pg_has_role(r.oid, c.relowner, 'USAGE')
           AND pg_catalog.has_table_privilege(r.oid, t.tgrelid, 'TRIGGER')) AS trigger_roles,
       CASE WHEN pg_catalog.bool_or(t.tgname = '~fence_rows_2_upd' OR (t.tgname = '~fence_guard_1_row' AND t.tgnargs >= 3)) THEN 'rows' ELSE 'table' END AS form,
       (max(fence._trigger_arg(t.tgargs, 2)) FILTER (WHERE t.tgname = '~fence_rows_2_upd' OR (t.tgname = '~fence_guard_1_row' AND t.tgnargs >= 3)))::name AS resource_column,
       (SELECT pg_catalog.bool_and(g.tgenabled = 'A') FROM pg_catalog.pg_trigger g JOIN pg_catalog.pg_proc p ON p.oid = g.tgfoid
         WHERE g.tgrelid = t.tgrelid AND p.pronamespace = 'fence'::pg_catalog.regnamespace AND NOT g.tgisinternal) AS fires_always,
       (SELECT pg_catalog.bool_and(g.tgenabled IN ('O', 'A')) FROM pg_catalog.pg_trigger g JOIN pg_catalog.pg_proc p ON p.oid = g.tgfoid
         WHERE g.tgrelid = t.tgrelid AND p.pronamespace = 'fence'::pg_catalog.regnamespace AND NOT g.tgisinternal) AS enabled
  FROM pg_catalog.pg_trigger t
 WHERE t.tgname IN ('zz_fence_guard_row', '~fence_guard_1_row', 'zz_fence_guard_stmt', '~fence_rows_2_upd')
   AND t.tgfoid IN (SELECT p.oid FROM pg_catalog.pg_proc p WHERE p.pronamespace = 'fence'::pg_catalog.regnamespace)
 GROUP BY t.tgrelid, fence._trigger_arg(t.tgargs, 0);
COMMENT ON VIEW fence.protected IS
    'every table guarded by fence.protect (form table: resource) or fence.protect_rows (form rows: resource is the prefix, resource_column names the rest), its token column (NULL: fence.use_token), the roles other than the owner that can create triggers on it, whether its guards fire in replica mode too (fires_always) and whether every guard fires for ordinary sessions, none disabled or set to fire in replica mode only (enabled)';

-- The per-row tables of 008 (a "~fence_rows_2_upd" trigger) get the new
-- guard when the migrating role owns them; the others are named.
DO $$
DECLARE
    r      record;
    others text[];
BEGIN
    FOR r IN SELECT t.tgrelid::pg_catalog.regclass AS tbl, fence._trigger_arg(t.tgargs, 0) AS pre,
                    NULLIF(fence._trigger_arg(t.tgargs, 1), '')::pg_catalog.name AS tcol,
                    fence._trigger_arg(t.tgargs, 2)::pg_catalog.name AS rcol,
                    pg_catalog.pg_has_role(CURRENT_USER, c.relowner, 'USAGE') AS mine
               FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid
              WHERE t.tgname = '~fence_rows_2_upd'
                AND t.tgfoid IN (SELECT p.oid FROM pg_catalog.pg_proc p WHERE p.pronamespace = 'fence'::pg_catalog.regnamespace)
              ORDER BY 1 LOOP
        IF r.mine THEN
            PERFORM fence.protect_rows(r.tbl, r.rcol, r.pre, r.tcol);
        ELSE
            others := others || r.tbl::pg_catalog.text;
        END IF;
    END LOOP;
    IF others IS NOT NULL THEN
        RAISE WARNING 'pgfence: per-row tables % keep the guard of migration 8', pg_catalog.array_to_string(others, ', ')
            USING HINT = 'the new guard is cheaper: have each table''s owner run fence.protect_rows on it again, with the same arguments (fence.protected lists them)';
    END IF;
END
$$;

-- As in 008, with fence.token_budget() (section 2) and the functions of section 5.
CREATE OR REPLACE FUNCTION fence.grant_usage(role name, operator boolean DEFAULT false) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    fn regprocedure;
BEGIN
    IF role IS NULL THEN
        RAISE EXCEPTION 'pgfence: role must not be NULL' USING ERRCODE = '22004', HINT = 'pass the name of the application role';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = role) THEN
        RAISE EXCEPTION 'pgfence: role % does not exist', role USING ERRCODE = '42704', HINT = 'create the role first (CREATE ROLE)';
    END IF;
    EXECUTE format('GRANT USAGE ON SCHEMA fence TO %I', role);
    EXECUTE format('GRANT SELECT ON fence.leases, fence.protected, fence.lease, fence.refusals TO %I', role);
    EXECUTE format('GRANT EXECUTE ON FUNCTION fence.acquire(text, text, interval, boolean), fence.acquire_session(text, text),
        fence.renew(text, bigint, interval), fence.release(text, bigint), fence.check(text, bigint),
        fence.use_token(text, bigint), fence.protect(regclass, text, name), fence.unprotect(regclass),
        fence.protect_rows(regclass, name, text, name),
        fence._guard_row(), fence._guard_stmt(), fence._guard_use_token(), fence._rows_truncate(),
        fence._registered_token(text, text, oid), fence._check_many(text[], bigint[], text, oid),
        fence._check_name(text, text), fence._lease_key(text, bigint), fence._gate_key(text), fence._trigger_arg(bytea, integer),
        fence._guard_function(regclass, name), fence._rows_function(regclass, name, name),
        fence._acting_role(), fence._acting_role_check(oid), fence._refuse(text, text, text, text), fence._guard_slow(text, bigint, bigint, text, oid), fence.fire_always(regclass, boolean), fence._pin_condition(name, name), fence._token_floor(), fence._guard_triggers(regclass),
        fence._owned_table(regclass, text), fence._protectable(regclass), fence._check_token_column(regclass, text, name),
        fence._floor_from_column(regclass, text, name), fence._drop_guards(regclass, text),
        fence._lock_check(text, bigint), fence._rows_slow(text, bigint, text, oid, boolean, boolean), fence._rows_kids(),
        fence._rows9_source(name, name), fence._rows9_mark_source(name, name), fence._rows9_function(regclass, name, name),
        fence._rows9_triggers(regclass, text, regprocedure, name, text, name, boolean), fence.allow_producers(regclass, boolean),
        fence.lock_key(text), fence.try_lock(text), fence.unlock(text),
        fence.try_xact_lock(text), fence.version(), fence.token_budget() TO %I', role);
    FOR fn IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
               WHERE p.pronamespace = 'fence'::pg_catalog.regnamespace AND p.proname ~ '^_(guard|rows)_[0-9a-f]{32}$' LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', fn, role);
    END LOOP;
    IF operator THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION fence.revoke(text), fence._raise_floor(bigint) TO %I', role);
    END IF;
END
$$;
COMMENT ON FUNCTION fence.grant_usage(name,boolean) IS 'grants role the use of the kit (leases, guards, advisory helpers); with operator => true also fence.revoke';

-- ---------------------------------------------------------------------------
-- 9. Version
-- ---------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION fence.version() RETURNS integer
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT 9 $$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA fence FROM PUBLIC;
SELECT fence._regrant_usage();
