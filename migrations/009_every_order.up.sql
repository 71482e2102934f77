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

-- As in 008, with the functions of section 5.
CREATE OR REPLACE FUNCTION fence.grant_usage(role name, operator boolean DEFAULT false) RETURNS void
LANGUAGE plpgsql
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
