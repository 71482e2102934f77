-- pgfence 007: no way around the guards or the token counter (issue 19).
--
-- What changes, each with the test that failed on 006 (the proofs are in
-- docs/design.md, "Who may write", "No token is granted twice" and
-- "Copies of a database"; the reference in docs/sql.md):
--
-- 1. Guards ask who the session acts as. PostgreSQL runs foreign-key
--    actions as the owner of the referencing table and SECURITY DEFINER code
--    as its owner, so a guard's own reads of the kit prove nothing about the
--    role that wrote. Every guard now checks, whenever current_user is not
--    the role the session acts as (SET ROLE, else the session user:
--    fence._acting_role), that this role has the kit's usage (42501
--    otherwise). A role without usage writes nothing, also through a
--    cascade or the owner's code (TestRoleWithoutUsageCannotWriteThroughACascade,
--    ...ThroughTheOwnersCode in sqlfuncs/routes_test.go).
-- 2. No token is granted twice after a crash, whatever the granting
--    transaction did at COMMIT. Crash recovery empties unlogged tables; the
--    first grant after it finds fence.epoch_cache empty, moves the token
--    counter 2^32 ahead (above every grant a crash can have lost) and
--    truncates the unlogged fence.commit_flush, which makes PostgreSQL flush
--    its commit whatever synchronous_commit says (a transaction that deletes
--    a relation file always does). TestNoTokenIsGrantedTwiceWhateverRunsAtCommit.
-- 3. The per-row TRUNCATE guard and fence.protect's floor read every row
--    (row_security = off: a policy that would hide rows fails the statement
--    instead). TestRowsTruncateUnderRowSecurity.
-- 4. fence.fire_always(tbl): the guards of both forms fire in replica mode
--    too; fence.protect and fence.protect_rows keep that setting.
--    TestFireAlwaysInReplicaMode.
-- 5. fence.origin names the database the kit was installed in; a copy made
--    with CREATE DATABASE ... TEMPLATE (or a data-only load beside another
--    install) is not at home and starts a new epoch at its first grant.
--    TestTemplateCopyStartsANewEpoch.
-- 6. Generated guard bodies are built in one pass, format() with %I
--    (TestRowsHostileColumnNames).
-- 7. The resource column of a per-row table cannot be retyped: the pin
--    trigger's WHEN names it (TestRowsResourceColumnCannotBeRetyped).
-- 8. Only a table's owner (or the kit's owner) makes the kit create guard
--    functions (TestOnlyOwnersMakeTheKitCreateFunctions).

-- ---------------------------------------------------------------------------
-- Tables
-- ---------------------------------------------------------------------------

-- The epoch state as this server validated it since its last crash
-- recovery (or promotion, or restore of its files): the grant's fast path
-- reads this row instead of fence.epoch_state. Unlogged, so crash recovery
-- empties it, and an empty file (no block at all) says that nothing was
-- granted since: see fence._epoch. One row; no index (an index would give
-- the file of an empty table a block).
CREATE UNLOGGED TABLE fence.epoch_cache (
    system_identifier bigint NOT NULL,
    datoid            oid NOT NULL,
    relid             oid NOT NULL,
    timeline          bigint NOT NULL,
    base              bigint NOT NULL
);
COMMENT ON TABLE fence.epoch_cache IS 'pgfence internal: the epoch state as validated since the last crash recovery (unlogged)';

-- Never holds a row. fence._epoch truncates it: a transaction that drops a
-- relation file flushes its commit record before it returns, whatever
-- synchronous_commit says (RecordTransactionCommit), so no session setting
-- and nothing that runs at COMMIT can make that grant asynchronous.
CREATE UNLOGGED TABLE fence.commit_flush ();
COMMENT ON TABLE fence.commit_flush IS 'pgfence internal: truncated to force a synchronous commit (never holds rows)';

-- The database (and cluster) this install lives in. No key: a data-only
-- load of another install's rows adds its row beside this one, and then
-- neither is at home (fence._epoch).
CREATE TABLE fence.origin (
    datoid            oid NOT NULL,
    system_identifier bigint NOT NULL
);
COMMENT ON TABLE fence.origin IS 'pgfence internal: the database and cluster the kit was installed in';

-- Whatever writes fence.origin (a data-only load of another install's
-- rows, fence._epoch after a restore) makes the next grant validate the
-- state again instead of trusting the cache.
CREATE FUNCTION fence._origin_changed() RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM fence.epoch_cache;
    RETURN NULL;
END
$$;
CREATE TRIGGER origin_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON fence.origin
    FOR EACH STATEMENT EXECUTE FUNCTION fence._origin_changed();

-- ---------------------------------------------------------------------------
-- Helpers
-- ---------------------------------------------------------------------------

-- The OID of this backend's database. IMMUTABLE like
-- fence._system_identifier: a backend never changes databases, so the
-- planner may evaluate it once per plan. Internal.
CREATE FUNCTION fence._database_oid() RETURNS oid
LANGUAGE sql IMMUTABLE
AS $$
    SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()
$$;

-- The role this session acts as: the one SET ROLE chose, else the session
-- user. Neither changes inside SECURITY DEFINER code or a foreign-key
-- action (they change only current_user), and SET ROLE needs membership, so
-- no setting can forge it. Inlined into the guards.
CREATE FUNCTION fence._acting_role() RETURNS name
LANGUAGE sql STABLE
AS $$
    SELECT CASE WHEN pg_catalog.current_setting('role') OPERATOR(pg_catalog.=) 'none' THEN SESSION_USER
                ELSE pg_catalog.current_setting('role')::pg_catalog.name END
$$;

-- Raises 42501 unless the role the session acts as has the kit's usage
-- (it could have called fence.use_token). The guards call it only when
-- current_user is another role (a cascade, SECURITY DEFINER code): when it
-- is the same role, the guard's own reads of the kit prove it.
CREATE FUNCTION fence._acting_role_check(rel oid) RETURNS void
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    r pg_catalog.name := fence._acting_role();
BEGIN
    IF (pg_catalog.has_schema_privilege(r, 'fence', 'USAGE')
        AND pg_catalog.has_function_privilege(r, 'fence.use_token(pg_catalog.text, pg_catalog.int8)', 'EXECUTE')) IS NOT TRUE THEN
        RAISE EXCEPTION 'pgfence: role % has no usage of the kit, so it cannot write to protected table %', r, rel::pg_catalog.regclass
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.format('the write runs as %s (a foreign-key action or SECURITY DEFINER code) on behalf of %s', CURRENT_USER, r),
                  HINT = pg_catalog.format('a role without the kit''s usage cannot write protected tables by any route: SELECT fence.grant_usage(%L) as the kit''s owner, or write as a role that has it', r);
    END IF;
END
$$;

-- The epoch of a grant made now, from the cache row c when it is known
-- good, else NULL (then fence._epoch). Replaces fence._state_epoch.
CREATE FUNCTION fence._cache_epoch(c fence.epoch_cache) RETURNS bigint
LANGUAGE sql VOLATILE
AS $$
    SELECT CASE WHEN c.system_identifier OPERATOR(pg_catalog.=) fence._system_identifier()
                 AND c.datoid OPERATOR(pg_catalog.=) fence._database_oid()
                 AND c.relid OPERATOR(pg_catalog.=) 'fence.epoch_state'::pg_catalog.regclass::pg_catalog.oid
                 AND c.timeline OPERATOR(pg_catalog.=) fence._timeline()
                 AND c.base OPERATOR(pg_catalog.+) c.timeline OPERATOR(pg_catalog.<) (1::pg_catalog.int8 OPERATOR(pg_catalog.<<) 20)
           THEN c.base OPERATOR(pg_catalog.+) c.timeline END
$$;

-- ---------------------------------------------------------------------------
-- The grant's slow path
-- ---------------------------------------------------------------------------

-- As in 003, plus: a database not at home (fence.origin) is treated as a
-- restore; and after it, the cache. docs/design.md, "No token is granted
-- twice" and "Copies of a database".
CREATE OR REPLACE FUNCTION fence._epoch() RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    sysid bigint := fence._system_identifier();
    mydb  oid := fence._database_oid();
    myrel oid := 'fence.epoch_state'::pg_catalog.regclass::oid;
    tli   bigint := fence._timeline();
    s     fence.epoch_state;
    home  boolean;
    nbase bigint;
BEGIN
    IF NOT EXISTS (SELECT FROM fence.epoch_state) THEN
        -- First grant of this install, or of a restore that brought lease
        -- rows but no state: start past every stored token.
        INSERT INTO fence.epoch_state (system_identifier, relid, timeline, base)
        VALUES (sysid, myrel, tli, coalesce((SELECT max(l.token) >> 43 FROM fence.lease l), 0))
        ON CONFLICT DO NOTHING;
    END IF;
    SELECT * INTO s FROM fence.epoch_state FOR UPDATE;
    -- At home: exactly the row the migration (or the last restore below)
    -- wrote for this database of this cluster.
    SELECT coalesce(count(*) = 1 AND bool_and(o.datoid = mydb AND o.system_identifier = sysid), false)
      INTO home FROM fence.origin o;
    IF s.system_identifier = sysid AND s.relid = myrel AND home AND s.timeline < tli THEN
        nbase := s.base;  -- promotion: the timeline alone moves the epoch up
        UPDATE fence.epoch_state SET timeline = tli;
    ELSIF s.system_identifier <> sysid OR s.relid <> myrel OR NOT home OR s.timeline > tli THEN
        -- a restored copy (another cluster, another database, a template
        -- copy) or a timeline that went back: move past every epoch this
        -- data has seen
        nbase := greatest(s.base + s.timeline,
                          coalesce((SELECT max(l.token) >> 43 FROM fence.lease l), 0));
        UPDATE fence.epoch_state SET system_identifier = sysid, relid = myrel, timeline = tli, base = nbase;
        DELETE FROM fence.origin;
        INSERT INTO fence.origin (datoid, system_identifier) VALUES (mydb, sysid);
    ELSE
        nbase := s.base;  -- just created, or another grant updated it while we waited
    END IF;
    IF nbase + tli >= (1::bigint << 20) THEN
        RAISE EXCEPTION 'pgfence token epochs are exhausted (epoch %)', nbase + tli
            USING ERRCODE = '54000',
                  HINT = 'the token layout allows 2^20 epochs (promotions and restores); see docs/design.md';
    END IF;
    -- An empty cache file: crash recovery (or a promotion, or a restore of
    -- the files) emptied it, and grants made before may be lost with their
    -- commits, while their callers hold the tokens. They took at most one
    -- counter value each, and no crash loses 2^32 of them: the counter moves
    -- past them all. (setval is not rolled back; a rolled-back attempt
    -- leaves a dead row in the file, so a retry does not move it again.)
    IF pg_catalog.pg_relation_size('fence.epoch_cache'::pg_catalog.regclass) = 0 THEN
        PERFORM pg_catalog.setval('fence.token_counter', (SELECT c.last_value FROM fence.token_counter c) + 4294967296);
    END IF;
    -- This transaction's commit is flushed before it returns, whatever
    -- synchronous_commit is at COMMIT: the counter's move and the new state
    -- are durable before any token above them is used.
    TRUNCATE fence.commit_flush;
    DELETE FROM fence.epoch_cache;
    INSERT INTO fence.epoch_cache (system_identifier, datoid, relid, timeline, base)
    VALUES (sysid, mydb, myrel, tli, nbase);
    RETURN nbase + tli;
END
$$;

-- As in 005, reading the cache instead of fence.epoch_state.
CREATE OR REPLACE FUNCTION fence._grant(resource text, holder text, kind text, ttl interval, force boolean, waiting boolean) RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_variable
DECLARE
    r     record;
    k     record;
    l     fence.lease;
    epoch bigint;
    spid  integer;
    now   timestamptz;
    t     bigint;
    durable text;  -- assigned, not PERFORMed: see fence._force_durable
BEGIN
    -- A live lease answers at once, without a lock (pollers never queue).
    SELECT c AS cache, x AS lease INTO r
      FROM fence.epoch_cache c LEFT JOIN fence.lease x ON x.resource = resource;
    l := r.lease;
    IF NOT force AND fence._live(l, pg_catalog.clock_timestamp()) AND (NOT waiting OR l.waiters) THEN
        RETURN NULL;
    END IF;
    epoch := fence._cache_epoch(r.cache);
    IF epoch IS NULL THEN
        epoch := fence._epoch();
    END IF;
    IF kind = 'session' THEN
        spid := pg_catalog.pg_backend_pid();
    END IF;
    durable := fence._force_durable();

    k := fence._lock_lease(resource, fence._grant_wait());
    IF NOT k.locked THEN
        RETURN NULL;
    END IF;
    l := k.lease;
    now := pg_catalog.clock_timestamp();
    IF l.resource IS NOT NULL AND NOT force AND fence._live(l, now) THEN
        IF waiting AND NOT l.waiters THEN
            UPDATE fence.lease x SET waiters = true WHERE x.resource = resource;
        END IF;
        RETURN NULL;
    END IF;

    t := fence._next_token(epoch, coalesce(l.token, 0));
    IF kind = 'session' THEN
        -- The session-level advisory lock of (resource, token) is the
        -- lease's life (docs/design.md, "Session leases"); skip a token
        -- whose key is taken.
        WHILE NOT pg_catalog.pg_try_advisory_lock(fence._lease_key(resource, t)) LOOP
            t := fence._next_token(t >> 43, t);
        END LOOP;
    END IF;
    IF l.resource IS NULL THEN
        -- ON CONFLICT: a caller under REPEATABLE READ may not see a row that
        -- a racing first grant committed after its snapshot; it is then busy.
        l.token := t;
        INSERT INTO fence.lease AS x (resource, token, holder, kind, acquired_at, expires_at, ended_at, session_pid, waiters)
        VALUES (resource, t, holder, kind, now, now + ttl, CASE WHEN kind = 'revoked' THEN now END, spid, false)
        ON CONFLICT DO NOTHING
        RETURNING x.token INTO t;
        IF t IS NULL AND kind = 'session' THEN
            PERFORM pg_catalog.pg_advisory_unlock(fence._lease_key(resource, l.token));
        END IF;
    ELSE
        UPDATE fence.lease x
           SET token = t, holder = holder, kind = kind, acquired_at = now, expires_at = now + ttl,
               ended_at = CASE WHEN kind = 'revoked' THEN now END,
               session_pid = spid, waiters = false
         WHERE x.resource = resource;
    END IF;
    RETURN t;
END
$$;

DROP FUNCTION fence._state_epoch(fence.epoch_state);

-- The highest token a grant made now could be below (as in 003), but
-- computed without a trace: fence._epoch runs in a subtransaction that is
-- rolled back, so fence.protect writes no state row, cache or origin (006
-- created the state row, and a data-only load after protect then collided
-- with it; docs/design.md, "Copies of a database"). What fence._epoch does
-- that no rollback undoes, moving the counter after a crash, is what the
-- next grant would do anyway.
CREATE OR REPLACE FUNCTION fence._token_floor() RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    e bigint;
BEGIN
    BEGIN
        e := fence._epoch();
        RAISE EXCEPTION USING ERRCODE = 'P0001', MESSAGE = 'pgfence: undo';
    EXCEPTION WHEN raise_exception THEN
        NULL;
    END;
    RETURN (e << 43) | (SELECT s.last_value - CASE WHEN s.is_called THEN 0 ELSE 1 END FROM fence.token_counter s);
END
$$;

-- As in 003, and the cache follows the new base.
CREATE OR REPLACE FUNCTION fence._raise_floor(floor bigint) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    e bigint;
    s fence.epoch_state;
BEGIN
    IF floor IS NULL OR floor <= fence._token_floor() THEN
        RETURN;
    END IF;
    e := fence._epoch();  -- creates or refreshes the state row
    SELECT * INTO s FROM fence.epoch_state FOR UPDATE;
    IF (floor >> 43) + 1 >= (1::bigint << 20) THEN
        RAISE EXCEPTION 'pgfence: token % is beyond the last epoch; no later token can be granted', floor
            USING ERRCODE = '54000',
                  HINT = 'the token column holds values that were never pgfence tokens: clear them (set them to NULL) and protect again';
    END IF;
    UPDATE fence.epoch_state SET base = (floor >> 43) + 1 - s.timeline;
    DELETE FROM fence.epoch_cache;
END
$$;

-- ---------------------------------------------------------------------------
-- Guards
-- ---------------------------------------------------------------------------

-- As in 003 (table-wide) and 004 (per-row), built in one pass: format()
-- with %1$I (and %2$I) for the column names, so that no name changes which
-- column a guard reads (006 replaced placeholders one after another, and
-- a column named job@T@ became job followed by the token column's name);
-- and with the check of the acting role. docs/design.md, "Fail closed",
-- "Per-row resources", "Who may write".
CREATE OR REPLACE FUNCTION fence._guard_source(col name) RETURNS text
LANGUAGE sql IMMUTABLE
AS $f$
    SELECT pg_catalog.format(pg_catalog.concat(
$s$
DECLARE
    res    pg_catalog.text := TG_ARGV[0];
    tok    pg_catalog.int8;
    ok     pg_catalog.bool;
    reg    pg_catalog.text;
BEGIN
$s$,
        CASE WHEN col IS NOT NULL THEN 
$s$
    IF TG_NAME OPERATOR(pg_catalog.=) '~fence_guard_0_mark' THEN
        IF NEW.%1$I OPERATOR(pg_catalog.<=) 0 THEN
            PERFORM fence.check(res, NEW.%1$I);
        END IF;
        NEW.%1$I := OPERATOR(pg_catalog.-) NEW.%1$I;
        RETURN NEW;
    END IF;
    IF TG_OP OPERATOR(pg_catalog.=) 'INSERT' THEN
        tok := NEW.%1$I;
    ELSIF TG_OP OPERATOR(pg_catalog.=) 'UPDATE' AND NEW.%1$I OPERATOR(pg_catalog.<) 0
          AND (OLD.%1$I IS NULL OR NEW.%1$I OPERATOR(pg_catalog.<>) OLD.%1$I) THEN
        tok := OPERATOR(pg_catalog.-) NEW.%1$I;
    END IF;
$s$
        END,
$s$
    IF CURRENT_USER OPERATOR(pg_catalog.<>) fence._acting_role() THEN
        PERFORM fence._acting_role_check(TG_RELID);
    END IF;
    IF tok IS NULL THEN
        -- the token fence.use_token registered (read here, not through
        -- fence._registered_token, which raises FN002 when there is none)
        reg := pg_catalog.current_setting('fence.tokens', true);
        IF reg OPERATOR(pg_catalog.<>) '' THEN
            tok := (reg::pg_catalog.jsonb OPERATOR(pg_catalog.->>) res)::bigint;
        END IF;
        IF tok IS NULL THEN
            tok := fence._registered_token(res, TG_OP, TG_RELID);
        END IF;
    END IF;
$s$,
$s$
    -- One query: the gate, tried, then the row as this statement's snapshot
    -- sees it. A version nobody updated or locked since it was written
    -- (xmax 0), read while we hold the gate, is the latest one at any
    -- isolation level, and stays so until we end: a grant takes the gate
    -- before it locks the row, and one that committed after our snapshot
    -- left its xmax on the version we see. Anything else, fence.check
    -- (it waits for the gate, locks the row under REPEATABLE READ, and
    -- words the error). docs/design.md, "Linearizable fencing".
    SELECT pg_catalog.pg_try_advisory_xact_lock_shared(fence._gate_key(res))
           AND x.xmax OPERATOR(pg_catalog.=) '0'::pg_catalog.xid AND x.token OPERATOR(pg_catalog.=) tok
      INTO ok FROM fence.lease x WHERE x.resource OPERATOR(pg_catalog.=) res;
    IF ok IS NOT TRUE THEN
        PERFORM fence.check(res, tok);
    END IF;
    IF TG_OP OPERATOR(pg_catalog.=) 'DELETE' THEN
        RETURN OLD;
    END IF;
$s$,
        CASE WHEN col IS NOT NULL THEN 
$s$
    IF TG_OP OPERATOR(pg_catalog.=) 'UPDATE' AND OLD.%1$I OPERATOR(pg_catalog.>) tok THEN
        RAISE EXCEPTION 'pgfence: stale fencing token %% for resource %%: the row already carries token %%', tok, res, OLD.%1$I
            USING ERRCODE = 'FN001', DETAIL = pg_catalog.format('resource=%%s token=%%s row_token=%%s', res, tok, OLD.%1$I),
                  HINT = 'an update may never lower the token column; acquire the lease again and use the new token';
    END IF;
    NEW.%1$I := tok;
$s$
        END,
$s$
    RETURN NEW;
END
$s$), col)
$f$;

CREATE OR REPLACE FUNCTION fence._rows_source(rcol name, tcol name) RETURNS text
LANGUAGE sql IMMUTABLE
AS $f$
    SELECT pg_catalog.format(pg_catalog.concat(
$s$
#variable_conflict use_variable
DECLARE
    pre pg_catalog.text := TG_ARGV[0];
    res pg_catalog.text;
    tok pg_catalog.int8;
    reg pg_catalog.text;
    regj pg_catalog.jsonb;
    rs pg_catalog.text[];
    ts pg_catalog.int8[];
    n pg_catalog.int4;
    held pg_catalog.int4;
    found_n pg_catalog.int8;
    stale pg_catalog.bool;
BEGIN
$s$,
        CASE WHEN tcol IS NOT NULL THEN
$s$
    IF TG_LEVEL OPERATOR(pg_catalog.=) 'ROW' THEN
        IF TG_NAME OPERATOR(pg_catalog.=) '~fence_guard_0_mark' THEN
            IF NEW.%2$I OPERATOR(pg_catalog.<=) 0 THEN
                PERFORM fence.check((pre OPERATOR(pg_catalog.||) NEW.%1$I::pg_catalog.text) COLLATE pg_catalog."C", NEW.%2$I);
            END IF;
            NEW.%2$I := OPERATOR(pg_catalog.-) NEW.%2$I;
            RETURN NEW;
        END IF;
        IF TG_OP OPERATOR(pg_catalog.=) 'UPDATE' AND NEW.%2$I OPERATOR(pg_catalog.<) 0
           AND (OLD.%2$I IS NULL OR NEW.%2$I OPERATOR(pg_catalog.<>) OLD.%2$I) THEN
            NEW.%2$I := OPERATOR(pg_catalog.-) NEW.%2$I;
            RETURN NEW;
        END IF;
        IF TG_OP OPERATOR(pg_catalog.=) 'INSERT' AND NEW.%2$I IS NOT NULL THEN
            RETURN NEW;
        END IF;
        res := (pre OPERATOR(pg_catalog.||) NEW.%1$I::pg_catalog.text) COLLATE pg_catalog."C";
        reg := pg_catalog.current_setting('fence.tokens', true);
        IF reg OPERATOR(pg_catalog.<>) '' THEN
            tok := (reg::pg_catalog.jsonb OPERATOR(pg_catalog.->>) res)::pg_catalog.int8;
        END IF;
        IF tok IS NULL THEN
            tok := fence._registered_token(res, TG_OP, TG_RELID);
        END IF;
        NEW.%2$I := tok;
        RETURN NEW;
    END IF;
$s$
        END,
$s$
    -- Rows of inheritance children (created after protect_rows) pass the
    -- statement triggers of this table but not its row triggers: refuse.
    IF EXISTS (SELECT FROM pg_catalog.pg_inherits i WHERE i.inhparent OPERATOR(pg_catalog.=) TG_RELID) THEN
        RAISE EXCEPTION 'pgfence: per-row protected table %% has inheritance children', TG_RELID::pg_catalog.regclass
            USING ERRCODE = '42809',
                  HINT = 'the guard does not see the children''s rows as they are written: drop the children (or ALTER TABLE ... NO INHERIT), or fence.unprotect the table';
    END IF;
    IF CURRENT_USER OPERATOR(pg_catalog.<>) fence._acting_role() THEN
        PERFORM fence._acting_role_check(TG_RELID);
    END IF;
    reg := pg_catalog.current_setting('fence.tokens', true);
    IF reg OPERATOR(pg_catalog.<>) '' THEN
        regj := reg::pg_catalog.jsonb;
    END IF;
    IF TG_OP OPERATOR(pg_catalog.=) 'INSERT' THEN
        SELECT pg_catalog.array_agg(q.r), pg_catalog.array_agg(q.t) INTO rs, ts FROM (
            SELECT DISTINCT (pre OPERATOR(pg_catalog.||) n.%1$I::pg_catalog.text) COLLATE pg_catalog."C" AS r, $s$,
        CASE WHEN tcol IS NOT NULL THEN 'n.%2$I'
             ELSE $s$(regj OPERATOR(pg_catalog.->>) ((pre OPERATOR(pg_catalog.||) n.%1$I::pg_catalog.text) COLLATE pg_catalog."C"))::pg_catalog.int8$s$ END,
$s$ AS t FROM fence_new n) q;
    ELSIF TG_OP OPERATOR(pg_catalog.=) 'DELETE' THEN
        SELECT pg_catalog.array_agg(q.r), pg_catalog.array_agg((regj OPERATOR(pg_catalog.->>) q.r)::pg_catalog.int8) INTO rs, ts FROM (
            SELECT DISTINCT (pre OPERATOR(pg_catalog.||) o.%1$I::pg_catalog.text) COLLATE pg_catalog."C" AS r FROM fence_old o) q;
    ELSE
$s$,
        CASE WHEN tcol IS NOT NULL THEN
$s$
        SELECT pg_catalog.array_agg(q.r), pg_catalog.array_agg(q.t) INTO rs, ts FROM (
            SELECT DISTINCT (pre OPERATOR(pg_catalog.||) n.%1$I::pg_catalog.text) COLLATE pg_catalog."C" AS r, n.%2$I AS t FROM fence_new n
            UNION ALL
            SELECT g.r, (regj OPERATOR(pg_catalog.->>) g.r)::pg_catalog.int8 FROM (
                SELECT DISTINCT (pre OPERATOR(pg_catalog.||) o.%1$I::pg_catalog.text) COLLATE pg_catalog."C" AS r FROM fence_old o) g
             WHERE NOT EXISTS (SELECT FROM fence_new n
                                WHERE (pre OPERATOR(pg_catalog.||) n.%1$I::pg_catalog.text) COLLATE pg_catalog."C" OPERATOR(pg_catalog.=) g.r)) q;
$s$
        ELSE
$s$
        SELECT pg_catalog.array_agg(q.r), pg_catalog.array_agg((regj OPERATOR(pg_catalog.->>) q.r)::pg_catalog.int8) INTO rs, ts FROM (
            SELECT (pre OPERATOR(pg_catalog.||) n.%1$I::pg_catalog.text) COLLATE pg_catalog."C" AS r FROM fence_new n
            UNION
            SELECT (pre OPERATOR(pg_catalog.||) o.%1$I::pg_catalog.text) COLLATE pg_catalog."C" FROM fence_old o) q;
$s$
        END,
$s$
    END IF;
    IF rs IS NULL THEN
        RETURN NULL;
    END IF;
    -- A statement over a few resources takes their gates in share mode (in
    -- key order), while the transaction holds at most 64 (counted in
    -- fence._gates; a forged count only moves statements to the row locks):
    -- a waiting grant then queues new writers behind it, and under READ
    -- COMMITTED the gates are the whole check (a read after them sees every
    -- grant that committed before, and none can commit until we end).
    -- Everything else, and every failure (for its error), goes to
    -- fence._check_many, which locks the lease rows. docs/design.md,
    -- "Per-row resources" (the lock budget, fairness).
    n := pg_catalog.cardinality(rs);
    IF n OPERATOR(pg_catalog.<=) 16 THEN
        reg := pg_catalog.current_setting('fence._gates', true);
        held := CASE WHEN reg OPERATOR(pg_catalog.~) '^[0-9]{1,4}$' THEN reg::pg_catalog.int4
                     WHEN COALESCE(reg, '') OPERATOR(pg_catalog.=) '' THEN 0 ELSE 64 END;
        IF held OPERATOR(pg_catalog.+) n OPERATOR(pg_catalog.<=) 64 AND pg_catalog.array_position(rs, NULL) IS NULL THEN
            IF n OPERATOR(pg_catalog.=) 1 THEN
                PERFORM pg_catalog.pg_advisory_xact_lock_shared(fence._gate_key(rs[1]));
            ELSE
                PERFORM pg_catalog.pg_advisory_xact_lock_shared(g.k)
                   FROM (SELECT DISTINCT fence._gate_key(u.r) AS k FROM pg_catalog.unnest(rs) AS u(r)) g ORDER BY g.k;
            END IF;
            PERFORM pg_catalog.set_config('fence._gates', (held OPERATOR(pg_catalog.+) n)::pg_catalog.text, true);
            IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed' THEN
                NULL;  -- the row locks of fence._check_many
            ELSIF n OPERATOR(pg_catalog.=) 1 THEN
                -- one resource (most statements): a plain read by key
                SELECT x.token OPERATOR(pg_catalog.<>) ts[1] INTO stale FROM fence.lease x WHERE x.resource OPERATOR(pg_catalog.=) rs[1];
                IF stale IS FALSE THEN
                    RETURN NULL;
                END IF;
            ELSE
                SELECT pg_catalog.count(*), pg_catalog.bool_or(u.t IS NULL OR u.t OPERATOR(pg_catalog.<>) l.token) INTO found_n, stale
                  FROM ROWS FROM (pg_catalog.unnest(rs), pg_catalog.unnest(ts)) AS u(r, t),
                       LATERAL (SELECT x.token FROM fence.lease x WHERE x.resource OPERATOR(pg_catalog.=) u.r) l;
                IF found_n OPERATOR(pg_catalog.=) n AND NOT stale THEN
                    RETURN NULL;
                END IF;
            END IF;
        END IF;
    END IF;
    PERFORM fence._check_many(rs, ts, TG_OP, TG_RELID);
    RETURN NULL;
END
$s$), rcol, tcol)
$f$;

-- The guard functions already generated get the new bodies (they keep
-- their names, owner, grants and comments): every table protected before
-- this migration gets the new checks at once, whoever owns it.
DO $$
DECLARE
    g record;
BEGIN
    EXECUTE pg_catalog.format('CREATE OR REPLACE FUNCTION fence._guard_use_token() RETURNS trigger LANGUAGE plpgsql VOLATILE AS %L',
                              fence._guard_source(NULL));
    FOR g IN SELECT DISTINCT p.oid::pg_catalog.regprocedure AS fn,
                    CASE WHEN p.proname LIKE '\_rows\_%'
                         THEN fence._rows_source(fence._trigger_arg(t.tgargs, 2)::name, NULLIF(fence._trigger_arg(t.tgargs, 1), '')::name)
                         ELSE fence._guard_source(fence._trigger_arg(t.tgargs, 1)::name) END AS src
               FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_trigger t ON t.tgfoid = p.oid
              WHERE p.pronamespace = 'fence'::pg_catalog.regnamespace AND p.proname ~ '^_(guard|rows)_[0-9a-f]{32}$' LOOP
        EXECUTE pg_catalog.format('CREATE OR REPLACE FUNCTION %s RETURNS trigger LANGUAGE plpgsql VOLATILE AS %L', g.fn, g.src);
    END LOOP;
END
$$;

-- As in 003, with the check of the acting role.
CREATE OR REPLACE FUNCTION fence._guard_stmt() RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF CURRENT_USER <> fence._acting_role() THEN
        PERFORM fence._acting_role_check(TG_RELID);
    END IF;
    PERFORM fence.check(TG_ARGV[0], fence._registered_token(TG_ARGV[0], TG_OP, TG_RELID));
    RETURN NULL;
END
$$;

-- As in 004, with the check of the acting role, and reading every row:
-- TRUNCATE ignores row-level security, so the guard must too. With
-- row_security = off a policy that would hide rows from this role fails the
-- read (42501) instead of hiding them; the table's owner (unless FORCE ROW
-- LEVEL SECURITY) and roles with BYPASSRLS read every row.
CREATE OR REPLACE FUNCTION fence._rows_truncate() RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET row_security = off
AS $$
DECLARE
    rs  text[];
    ts  bigint[];
    reg jsonb := nullif(current_setting('fence.tokens', true), '')::jsonb;
BEGIN
    -- Always, not only when current_user is another role: with row
    -- security, or on an empty table, the read below may reach no fence
    -- object that would refuse a role without usage.
    PERFORM fence._acting_role_check(TG_RELID);
    -- The rows are read with a snapshot of the transaction's: under
    -- REPEATABLE READ or SERIALIZABLE it may predate rows that TRUNCATE
    -- removes all the same, whose resources would then go unchecked.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'pgfence: TRUNCATE of per-row protected table % needs READ COMMITTED', TG_RELID::regclass
            USING ERRCODE = '0A000',
                  HINT = 'under REPEATABLE READ or SERIALIZABLE the rows of resources granted after the snapshot would go unchecked: truncate under READ COMMITTED, or DELETE';
    END IF;
    BEGIN
        EXECUTE format('SELECT array_agg(DISTINCT (%L || %I::text) COLLATE "C") FROM %s', TG_ARGV[0], TG_ARGV[2], TG_RELID::regclass) INTO rs;
    EXCEPTION WHEN insufficient_privilege THEN
        RAISE EXCEPTION 'pgfence: TRUNCATE of per-row protected table % needs to read every row, and row-level security hides some from %', TG_RELID::regclass, CURRENT_USER
            USING ERRCODE = '42501',
                  HINT = 'TRUNCATE removes the rows of every resource, so the guard checks the token of each: truncate as a role that sees every row (the table''s owner, or one with BYPASSRLS), or DELETE the rows of your own resources';
    END;
    IF rs IS NOT NULL THEN
        ts := ARRAY(SELECT (reg ->> u.r)::bigint FROM unnest(rs) WITH ORDINALITY AS u(r, i) ORDER BY u.i);
        PERFORM fence._check_many(rs, ts, TG_OP, TG_RELID);
    END IF;
    RETURN NULL;
END
$$;

-- As in 003, reading every row (see fence._rows_truncate).
CREATE OR REPLACE FUNCTION fence._floor_from_column(tbl regclass, qn text, col name) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET row_security = off
AS $$
DECLARE
    floor bigint;
BEGIN
    BEGIN
        EXECUTE format('SELECT max(%I) FROM %s', col, qn) INTO floor;
    EXCEPTION WHEN insufficient_privilege THEN
        RAISE EXCEPTION 'pgfence: protecting % needs to read the token column of every row, and row-level security hides some from %', tbl, CURRENT_USER
            USING ERRCODE = '42501',
                  HINT = format('later grants must exceed every token the rows carry: ALTER TABLE %s NO FORCE ROW LEVEL SECURITY, protect it, then FORCE ROW LEVEL SECURITY again', qn);
    END;
    IF floor IS NOT NULL AND floor > fence._token_floor() THEN
        IF NOT has_function_privilege('fence._raise_floor(bigint)', 'EXECUTE') THEN
            RAISE EXCEPTION 'pgfence: column % of % holds token %, above every token granted so far', col, tbl, floor
                USING ERRCODE = '42501',
                      HINT = 'the rows come from a restore or an earlier install: have the kit''s owner or an operator run this protect again, so later grants exceed them';
        END IF;
        PERFORM fence._raise_floor(floor);
    END IF;
END
$$;

-- The generated guard functions, as in 003 and 004, but: only a role the
-- session acts as that owns tbl (or is a member of its owner) makes the kit
-- create one (006 let any role with usage create a function per column
-- name it passed); and the body is written every time (CREATE OR REPLACE),
-- so that a function generated by an older migration is never reused with
-- its old body.
DROP FUNCTION fence._guard_function(name);
DROP FUNCTION fence._rows_function(name, name);

CREATE FUNCTION fence._guard_maker(tbl regclass) RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF pg_has_role(fence._acting_role(), (SELECT c.relowner FROM pg_class c WHERE c.oid = tbl), 'USAGE') IS NOT TRUE THEN
        RAISE EXCEPTION 'pgfence: only the owner of table % can make the kit create its guard', tbl
            USING ERRCODE = '42501', HINT = 'run fence.protect or fence.protect_rows as the role that owns the table';
    END IF;
END
$$;

CREATE FUNCTION fence._guard_function(tbl regclass, col name) RETURNS regprocedure
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    fname text := '_guard_' || md5(col);
    fn    regprocedure;
    rl    name;
BEGIN
    PERFORM fence._guard_maker(tbl);
    -- concurrent first protects of one column name: one creates, the other waits
    PERFORM pg_advisory_xact_lock(fence._gate_key('guard function ' || fname));
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

CREATE FUNCTION fence._rows_function(tbl regclass, rcol name, tcol name) RETURNS regprocedure
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    fname text := '_rows_' || md5(format('%I,%s', rcol, coalesce(quote_ident(tcol), '')));
    fn    regprocedure;
    rl    name;
BEGIN
    PERFORM fence._guard_maker(tbl);
    PERFORM pg_advisory_xact_lock(fence._gate_key('guard function ' || fname));
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
-- Protecting tables
-- ---------------------------------------------------------------------------

-- Makes the guards of tbl fire in replica mode too (enabled), or only in
-- origin and local mode again (not enabled, PostgreSQL's default): ALTER
-- TABLE ... ENABLE ALWAYS TRIGGER on each of them. A session with
-- session_replication_role = replica (superusers, and roles granted SET on
-- that parameter) skips ordinary triggers; with this it is fenced like any
-- other. Only the table's owner may. A subscription's apply worker is then
-- fenced too: leave it off on logical-replication targets.
CREATE FUNCTION fence.fire_always(tbl regclass, enabled boolean DEFAULT true) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    qn text := fence._owned_table(tbl, 'fire_always');
    tg name;
    n  integer := 0;
BEGIN
    IF enabled IS NULL THEN
        RAISE EXCEPTION 'pgfence: enabled must not be NULL' USING ERRCODE = '22004', HINT = 'pass true (fire in replica mode too) or false';
    END IF;
    FOR tg IN SELECT fence._guard_triggers(tbl) LOOP
        EXECUTE format('ALTER TABLE %s %s TRIGGER %I', qn, CASE WHEN enabled THEN 'ENABLE ALWAYS' ELSE 'ENABLE' END, tg);
        n := n + 1;
    END LOOP;
    IF n = 0 THEN
        RAISE EXCEPTION 'pgfence: table % is not protected', tbl
            USING ERRCODE = '55000', HINT = 'protect it first with fence.protect or fence.protect_rows';
    END IF;
END
$$;
COMMENT ON FUNCTION fence.fire_always(regclass, boolean) IS
    'makes the guards of tbl fire in replica mode too (session_replication_role = replica), or not (enabled => false)';

-- As in 004: only the guard function comes from fence._guard_function with
-- the table, and guards that fired in replica mode still do.
CREATE OR REPLACE FUNCTION fence.protect(tbl regclass, resource text, token_column name DEFAULT NULL) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    qn     text;
    fn     regprocedure;
    always boolean;
BEGIN
    qn := fence._owned_table(tbl, 'protect');
    PERFORM fence._check_name('resource', resource);
    PERFORM fence._protectable(tbl);
    IF token_column IS NOT NULL THEN
        PERFORM fence._check_token_column(tbl, qn, token_column);
        fn := fence._guard_function(tbl, token_column);
    END IF;
    always := EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = tbl AND t.tgenabled = 'A'
                         AND t.tgname IN (SELECT fence._guard_triggers(tbl)));
    PERFORM fence._drop_guards(tbl, qn);
    IF token_column IS NOT NULL THEN
        EXECUTE format('CREATE TRIGGER "~fence_guard_0_mark" BEFORE UPDATE OF %I ON %s FOR EACH ROW EXECUTE FUNCTION %s(%L, %L)',
                       token_column, qn, fn::regproc, resource, token_column);
        EXECUTE format('CREATE TRIGGER "~fence_guard_1_row" BEFORE INSERT OR UPDATE OR DELETE ON %s FOR EACH ROW EXECUTE FUNCTION %s(%L, %L)',
                       qn, fn::regproc, resource, token_column);
    ELSE
        EXECUTE format('CREATE TRIGGER "~fence_guard_1_row" BEFORE INSERT OR UPDATE OR DELETE ON %s FOR EACH ROW EXECUTE FUNCTION fence._guard_use_token(%L)',
                       qn, resource);
    END IF;
    EXECUTE format('CREATE TRIGGER zz_fence_guard_stmt BEFORE TRUNCATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION fence._guard_stmt(%L)',
                   qn, resource);
    IF always THEN
        PERFORM fence.fire_always(tbl, true);
    END IF;
    IF token_column IS NOT NULL THEN
        PERFORM fence._floor_from_column(tbl, qn, token_column);
    END IF;
END
$$;

-- The WHEN condition of the pin trigger of a per-row table: never true, and
-- naming the resource column (and the token column), so that PostgreSQL
-- refuses to change their types while the guard depends on them (the
-- guard's text form of a resource must not follow a session setting, as a
-- timestamptz would follow TimeZone).
CREATE FUNCTION fence._pin_condition(rcol name, tcol name) RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
    SELECT pg_catalog.format('OLD.%I IS NULL AND %s false', rcol,
                             CASE WHEN tcol IS NULL THEN '' ELSE pg_catalog.format('OLD.%I IS NULL AND', tcol) END)
$$;

-- As in 004, with the table passed to fence._rows_function, the pin on the
-- columns, and fire_always kept.
CREATE OR REPLACE FUNCTION fence.protect_rows(tbl regclass, resource_column name, resource_prefix text DEFAULT '', token_column name DEFAULT NULL) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    qn     text;
    fn     regprocedure;
    a      record;
    tc     text := coalesce(token_column, '');
    always boolean;
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
    fn := fence._rows_function(tbl, resource_column, token_column);

    always := EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = tbl AND t.tgenabled = 'A'
                         AND t.tgname IN (SELECT fence._guard_triggers(tbl)));
    PERFORM fence._drop_guards(tbl, qn);
    IF token_column IS NOT NULL THEN
        EXECUTE format('CREATE TRIGGER "~fence_guard_0_mark" BEFORE UPDATE OF %I ON %s FOR EACH ROW EXECUTE FUNCTION %s(%L, %L, %L)',
                       token_column, qn, fn::regproc, resource_prefix, tc, resource_column);
        EXECUTE format('CREATE TRIGGER "~fence_guard_1_ins" BEFORE INSERT ON %s FOR EACH ROW WHEN (NEW.%I IS NULL) EXECUTE FUNCTION %s(%L, %L, %L)',
                       qn, token_column, fn::regproc, resource_prefix, tc, resource_column);
        EXECUTE format('CREATE TRIGGER "~fence_guard_1_row" BEFORE UPDATE ON %s FOR EACH ROW EXECUTE FUNCTION %s(%L, %L, %L)',
                       qn, fn::regproc, resource_prefix, tc, resource_column);
    END IF;
    EXECUTE format('CREATE TRIGGER "~fence_rows_2_ins" AFTER INSERT ON %s REFERENCING NEW TABLE AS fence_new FOR EACH STATEMENT EXECUTE FUNCTION %s(%L, %L, %L)',
                   qn, fn::regproc, resource_prefix, tc, resource_column);
    EXECUTE format('CREATE TRIGGER "~fence_rows_2_upd" AFTER UPDATE ON %s REFERENCING OLD TABLE AS fence_old NEW TABLE AS fence_new FOR EACH STATEMENT EXECUTE FUNCTION %s(%L, %L, %L)',
                   qn, fn::regproc, resource_prefix, tc, resource_column);
    EXECUTE format('CREATE TRIGGER "~fence_rows_2_del" AFTER DELETE ON %s REFERENCING OLD TABLE AS fence_old FOR EACH STATEMENT EXECUTE FUNCTION %s(%L, %L, %L)',
                   qn, fn::regproc, resource_prefix, tc, resource_column);
    EXECUTE format('CREATE TRIGGER "~fence_rows_3_pin" AFTER DELETE ON %s REFERENCING OLD TABLE AS fence_old FOR EACH ROW WHEN (%s) EXECUTE FUNCTION %s(%L, %L, %L)',
                   qn, fence._pin_condition(resource_column, token_column), fn::regproc, resource_prefix, tc, resource_column);
    EXECUTE format('CREATE TRIGGER zz_fence_guard_stmt BEFORE TRUNCATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION fence._rows_truncate(%L, %L, %L)',
                   qn, resource_prefix, tc, resource_column);
    IF always THEN
        PERFORM fence.fire_always(tbl, true);
    END IF;
    IF token_column IS NOT NULL THEN
        PERFORM fence._floor_from_column(tbl, qn, token_column);
    END IF;
END
$$;

-- As in 004, plus whether every guard trigger fires in replica mode too
-- (fire_always) and whether none is disabled.
CREATE OR REPLACE VIEW fence.protected AS
SELECT t.tgrelid::regclass AS tbl,
       fence._trigger_arg(t.tgargs, 0) AS resource,
       (CASE WHEN pg_catalog.bool_or(t.tgname = '~fence_rows_2_upd')
             THEN NULLIF(max(fence._trigger_arg(t.tgargs, 1)) FILTER (WHERE t.tgname = '~fence_rows_2_upd'), '')
             ELSE max(fence._trigger_arg(t.tgargs, 1)) FILTER (WHERE t.tgname IN ('zz_fence_guard_row', '~fence_guard_1_row')) END)::name AS token_column,
       (SELECT pg_catalog.array_agg(r.rolname ORDER BY r.rolname)
          FROM pg_catalog.pg_roles r, pg_catalog.pg_class c
         WHERE c.oid = t.tgrelid
           AND NOT r.rolsuper
           AND NOT pg_catalog.pg_has_role(r.oid, c.relowner, 'USAGE')
           AND pg_catalog.has_table_privilege(r.oid, t.tgrelid, 'TRIGGER')) AS trigger_roles,
       CASE WHEN pg_catalog.bool_or(t.tgname = '~fence_rows_2_upd') THEN 'rows' ELSE 'table' END AS form,
       (max(fence._trigger_arg(t.tgargs, 2)) FILTER (WHERE t.tgname = '~fence_rows_2_upd'))::name AS resource_column,
       (SELECT pg_catalog.bool_and(g.tgenabled = 'A') FROM pg_catalog.pg_trigger g JOIN pg_catalog.pg_proc p ON p.oid = g.tgfoid
         WHERE g.tgrelid = t.tgrelid AND p.pronamespace = 'fence'::pg_catalog.regnamespace AND NOT g.tgisinternal) AS fires_always,
       (SELECT pg_catalog.bool_and(g.tgenabled <> 'D') FROM pg_catalog.pg_trigger g JOIN pg_catalog.pg_proc p ON p.oid = g.tgfoid
         WHERE g.tgrelid = t.tgrelid AND p.pronamespace = 'fence'::pg_catalog.regnamespace AND NOT g.tgisinternal) AS enabled
  FROM pg_catalog.pg_trigger t
 WHERE t.tgname IN ('zz_fence_guard_row', '~fence_guard_1_row', 'zz_fence_guard_stmt', '~fence_rows_2_upd')
   AND t.tgfoid IN (SELECT p.oid FROM pg_catalog.pg_proc p WHERE p.pronamespace = 'fence'::pg_catalog.regnamespace)
 GROUP BY t.tgrelid, fence._trigger_arg(t.tgargs, 0);
COMMENT ON VIEW fence.protected IS
    'every table guarded by fence.protect (form table: resource) or fence.protect_rows (form rows: resource is the prefix, resource_column names the rest), its token column (NULL: fence.use_token), the roles other than the owner that can create triggers on it, whether its guards fire in replica mode too (fires_always) and whether none is disabled (enabled)';

-- ---------------------------------------------------------------------------
-- Privileges and version
-- ---------------------------------------------------------------------------

-- As in 006, with the new helpers the guards call and fence.fire_always.
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
    EXECUTE format('GRANT SELECT ON fence.leases, fence.protected, fence.lease TO %I', role);
    EXECUTE format('GRANT EXECUTE ON FUNCTION fence.acquire(text, text, interval, boolean), fence.acquire_session(text, text),
        fence.renew(text, bigint, interval), fence.release(text, bigint), fence.check(text, bigint),
        fence.use_token(text, bigint), fence.protect(regclass, text, name), fence.unprotect(regclass),
        fence.protect_rows(regclass, name, text, name),
        fence._guard_row(), fence._guard_stmt(), fence._guard_use_token(), fence._rows_truncate(),
        fence._registered_token(text, text, oid), fence._check_many(text[], bigint[], text, oid),
        fence._check_name(text, text), fence._lease_key(text, bigint), fence._gate_key(text), fence._trigger_arg(bytea, integer),
        fence._guard_function(regclass, name), fence._rows_function(regclass, name, name),
        fence._acting_role(), fence._acting_role_check(oid), fence.fire_always(regclass, boolean), fence._pin_condition(name, name), fence._token_floor(), fence._guard_triggers(regclass),
        fence._owned_table(regclass, text), fence._protectable(regclass), fence._check_token_column(regclass, text, name),
        fence._floor_from_column(regclass, text, name), fence._drop_guards(regclass, text),
        fence.lock_key(text), fence.try_lock(text), fence.unlock(text),
        fence.try_xact_lock(text), fence.version() TO %I', role);
    FOR fn IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
               WHERE p.pronamespace = 'fence'::pg_catalog.regnamespace AND p.proname ~ '^_(guard|rows)_[0-9a-f]{32}$' LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', fn, role);
    END LOOP;
    IF operator THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION fence.revoke(text), fence._raise_floor(bigint) TO %I', role);
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION fence.version() RETURNS integer
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT 7 $$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA fence FROM PUBLIC;

SELECT fence._regrant_usage();

-- ---------------------------------------------------------------------------
-- Data
-- ---------------------------------------------------------------------------

-- This install lives here. On a fresh install (no grant yet) the cache file
-- gets its first block, so that the first grant does not take an empty file
-- for a crash; after an upgrade the first grant moves the counter once (a
-- crash before this migration may have lost grants too).
INSERT INTO fence.origin (datoid, system_identifier) VALUES (fence._database_oid(), fence._system_identifier());
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM fence.lease) AND NOT (SELECT c.is_called FROM fence.token_counter c) THEN
        INSERT INTO fence.epoch_cache VALUES (0, 0, 0, 0, 0);
        DELETE FROM fence.epoch_cache;
    END IF;
END
$$;

-- Per-row tables protected before: their pin trigger gets the new WHEN
-- condition where this role may (it owns the table, or is a member of its
-- owner); the others are named, for their owners to run
-- fence.protect_rows again.
DO $$
DECLARE
    p    record;
    kept text;
BEGIN
    FOR p IN SELECT t.tgrelid::pg_catalog.regclass AS tbl, t.tgfoid::pg_catalog.regproc AS fn, c.relowner,
                    fence._trigger_arg(t.tgargs, 0) AS pre, fence._trigger_arg(t.tgargs, 1) AS tc,
                    fence._trigger_arg(t.tgargs, 2) AS rc, t.tgenabled
               FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid
              WHERE t.tgname = '~fence_rows_3_pin' LOOP
        IF pg_catalog.pg_has_role(current_user, p.relowner, 'USAGE') THEN
            EXECUTE pg_catalog.format('DROP TRIGGER "~fence_rows_3_pin" ON %s', p.tbl);
            EXECUTE pg_catalog.format('CREATE TRIGGER "~fence_rows_3_pin" AFTER DELETE ON %s REFERENCING OLD TABLE AS fence_old FOR EACH ROW WHEN (%s) EXECUTE FUNCTION %s(%L, %L, %L)',
                                      p.tbl, fence._pin_condition(p.rc::name, NULLIF(p.tc, '')::name), p.fn, p.pre, p.tc, p.rc);
            IF p.tgenabled = 'A' THEN
                EXECUTE pg_catalog.format('ALTER TABLE %s ENABLE ALWAYS TRIGGER "~fence_rows_3_pin"', p.tbl);
            END IF;
        ELSE
            kept := pg_catalog.concat_ws(', ', kept, p.tbl::text);
        END IF;
    END LOOP;
    IF kept IS NOT NULL THEN
        RAISE WARNING 'pgfence: the resource column of these per-row tables can still be retyped: %', kept
            USING HINT = 'their owners should run SELECT fence.protect_rows(table, resource_column, prefix, token_column) again (see fence.protected)';
    END IF;
END
$$;
