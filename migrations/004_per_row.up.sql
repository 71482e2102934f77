-- pgfence 004: per-row resources.
--
-- fence.protect_rows(tbl, resource_column, resource_prefix, token_column)
-- guards a table whose rows belong to different resources: the resource of
-- a row is resource_prefix || the row's resource_column::text, and a write
-- commits only if it presented the latest token of the resource of every row
-- it wrote (the new row's resource, and the old row's too when the write
-- moved the row or deleted it). The rule for how a write presents a token is
-- fence.protect's (docs/sql.md, "Guards"); the design, and why the check
-- locks lease rows instead of taking one advisory lock per resource, are in
-- docs/design.md, "Per-row resources".
--
-- Nothing here changes tables protected with fence.protect.

-- ---------------------------------------------------------------------------
-- The check of many resources at once
-- ---------------------------------------------------------------------------

-- Raises unless, for every i, tok[i] is the latest token of resource res[i]
-- (FN002 when tok[i] is NULL, FN003 when res[i] was never granted or is
-- NULL, FN001 when tok[i] is older), and keeps every grant of res from
-- committing until the transaction ends by locking their lease rows FOR KEY
-- SHARE. (The gates a small statement takes are the guard's business:
-- fence._rows_source.)
--
-- Why that is guarantee 3 per resource, and why row locks rather than one
-- advisory lock per resource (the lock table), is in docs/design.md,
-- "Per-row resources".
--
-- op and rel only word the errors. SECURITY DEFINER: a row lock needs UPDATE
-- on fence.lease, which writers do not have; EXECUTE comes with the kit's
-- usage, so a role without it cannot write a per-row table at all (42501).
CREATE FUNCTION fence._check_many(res text[], tok bigint[], op text, rel oid) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    found_n bigint;
    stale   boolean;
    bad     record;
BEGIN
    -- Lock and compare in one pass: one index probe per resource (LATERAL,
    -- so that no plan hashes the whole of fence.lease to find a few rows).
    SELECT count(*), coalesce(bool_or(n.t IS DISTINCT FROM l.token), false) INTO found_n, stale
      FROM unnest(res, tok) AS n(r, t),
           LATERAL (SELECT x.token FROM fence.lease x WHERE x.resource = n.r FOR KEY SHARE) l;
    IF found_n = cardinality(res) AND NOT stale THEN
        RETURN;
    END IF;
    -- The first entry that fails, for the error (this path ends the statement).
    SELECT n.r, n.t INTO bad
      FROM unnest(res, tok) WITH ORDINALITY AS n(r, t, i)
      LEFT JOIN fence.lease x ON x.resource = n.r
     WHERE n.r IS NULL OR n.t IS NULL OR x.token IS DISTINCT FROM n.t
     ORDER BY n.i LIMIT 1;
    IF bad.r IS NULL THEN
        RAISE EXCEPTION 'pgfence: a row of % has no resource: its resource column is NULL', rel::regclass
            USING ERRCODE = 'FN003', DETAIL = 'resource=NULL',
                  HINT = 'declare the resource column NOT NULL';
    END IF;
    IF bad.t IS NULL THEN
        PERFORM fence._registered_token(bad.r, op, rel);
    END IF;
    PERFORM fence.check(bad.r, bad.t);
    -- fence.check passed: the lease row changed between the two reads (it
    -- cannot while we hold the gate or the lock; refuse all the same)
    RAISE EXCEPTION 'pgfence: stale fencing token % for resource %', bad.t, bad.r
        USING ERRCODE = 'FN001', DETAIL = format('resource=%s token=%s', bad.r, bad.t),
              HINT = 'acquire the lease again and use the new token';
END
$$;

-- ---------------------------------------------------------------------------
-- The per-row guard
-- ---------------------------------------------------------------------------

-- The body of the guard of per-row tables whose resource column is rcol and
-- token column tcol (NULL: fence.use_token only). One function per pair of
-- column names, fence._rows_function; its triggers pass (resource_prefix,
-- token column or '', resource column). Triggers fence.protect_rows creates:
--
--   ~fence_guard_0_mark  BEFORE UPDATE OF tcol  FOR EACH ROW  (with tcol)
--   ~fence_guard_1_ins   BEFORE INSERT          FOR EACH ROW  WHEN (NEW.tcol IS NULL)  (with tcol)
--   ~fence_guard_1_row   BEFORE UPDATE          FOR EACH ROW  (with tcol)
--   ~fence_rows_2_ins    AFTER INSERT  REFERENCING NEW TABLE           FOR EACH STATEMENT
--   ~fence_rows_2_upd    AFTER UPDATE  REFERENCING OLD TABLE NEW TABLE FOR EACH STATEMENT
--   ~fence_rows_2_del    AFTER DELETE  REFERENCING OLD TABLE           FOR EACH STATEMENT
--   ~fence_rows_3_pin    AFTER DELETE  REFERENCING OLD TABLE FOR EACH ROW WHEN (false)
--   zz_fence_guard_stmt  BEFORE TRUNCATE (fence._rows_truncate)
--
-- The row triggers decide which token each row presents, exactly as the
-- table-wide guard does (fence._guard_source: the mark trigger stores an
-- assigned token negated, the row trigger restores it; a row whose UPDATE
-- did not assign the column, or an INSERT that left it NULL, gets the token
-- fence.use_token registered for the row's resource, or FN002). They leave
-- the presented token in the column and check nothing themselves.
--
-- The statement triggers check: after the statement, every new row's token
-- against its resource's latest, and every resource the statement took rows
-- away from (DELETE, or an UPDATE that changed the resource column) against
-- the token fence.use_token registered for it, unless new rows of the same
-- statement presented that resource's token. Tables without a token column
-- need fence.use_token for every resource of every old and new row. One
-- set-based check per statement (a small one under READ COMMITTED inline:
-- gates, then a read; the others in fence._check_many), so that a statement
-- over many resources costs one join, not a query per row.
-- The statement triggers see the rows as written, after every BEFORE
-- trigger of the table.
--
-- A statement trigger does not fire for rows written through a parent table;
-- the pin (a row trigger with a transition table, never fired) makes
-- PostgreSQL refuse to attach the table as a partition or inheritance child.
--
-- Runs with the writer's rights and search_path: every name, operator and
-- type is schema-qualified (see fence._guard_source), and the resource
-- column is converted to text by a cast to pg_catalog.text of one of the
-- built-in types fence.protect_rows accepts (no user code runs). Resource
-- names are compared byte by byte (COLLATE "C"), as fence.lease compares
-- them: under a nondeterministic collation of the resource column,
-- 'user:Alice' and 'user:alice' would otherwise be one resource to DISTINCT
-- and NOT EXISTS while they are two leases. #variable_conflict: a column of
-- the table named like a variable (pre, regj, ...) must not make every write
-- fail. A table that got inheritance children after protect_rows refuses
-- every write: the parent's row triggers do not fire for the children's
-- rows, while its statement triggers see them.
CREATE FUNCTION fence._rows_source(rcol name, tcol name) RETURNS text
LANGUAGE sql IMMUTABLE
AS $f$
    SELECT pg_catalog.replace(pg_catalog.replace(pg_catalog.replace(pg_catalog.concat(
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
            IF NEW.@T@ OPERATOR(pg_catalog.<=) 0 THEN
                PERFORM fence.check((pre OPERATOR(pg_catalog.||) NEW.@R@::pg_catalog.text) COLLATE pg_catalog."C", NEW.@T@);
            END IF;
            NEW.@T@ := OPERATOR(pg_catalog.-) NEW.@T@;
            RETURN NEW;
        END IF;
        IF TG_OP OPERATOR(pg_catalog.=) 'UPDATE' AND NEW.@T@ OPERATOR(pg_catalog.<) 0
           AND (OLD.@T@ IS NULL OR NEW.@T@ OPERATOR(pg_catalog.<>) OLD.@T@) THEN
            NEW.@T@ := OPERATOR(pg_catalog.-) NEW.@T@;
            RETURN NEW;
        END IF;
        IF TG_OP OPERATOR(pg_catalog.=) 'INSERT' AND NEW.@T@ IS NOT NULL THEN
            RETURN NEW;
        END IF;
        res := (pre OPERATOR(pg_catalog.||) NEW.@R@::pg_catalog.text) COLLATE pg_catalog."C";
        reg := pg_catalog.current_setting('fence.tokens', true);
        IF reg OPERATOR(pg_catalog.<>) '' THEN
            tok := (reg::pg_catalog.jsonb OPERATOR(pg_catalog.->>) res)::pg_catalog.int8;
        END IF;
        IF tok IS NULL THEN
            tok := fence._registered_token(res, TG_OP, TG_RELID);
        END IF;
        NEW.@T@ := tok;
        RETURN NEW;
    END IF;
$s$
        END,
$s$
    -- Rows of inheritance children (created after protect_rows) pass the
    -- statement triggers of this table but not its row triggers: refuse.
    IF EXISTS (SELECT FROM pg_catalog.pg_inherits i WHERE i.inhparent OPERATOR(pg_catalog.=) TG_RELID) THEN
        RAISE EXCEPTION 'pgfence: per-row protected table % has inheritance children', TG_RELID::pg_catalog.regclass
            USING ERRCODE = '42809',
                  HINT = 'the guard does not see the children''s rows as they are written: drop the children (or ALTER TABLE ... NO INHERIT), or fence.unprotect the table';
    END IF;
    reg := pg_catalog.current_setting('fence.tokens', true);
    IF reg OPERATOR(pg_catalog.<>) '' THEN
        regj := reg::pg_catalog.jsonb;
    END IF;
    IF TG_OP OPERATOR(pg_catalog.=) 'INSERT' THEN
        SELECT pg_catalog.array_agg(q.r), pg_catalog.array_agg(q.t) INTO rs, ts FROM (
            SELECT DISTINCT (pre OPERATOR(pg_catalog.||) n.@R@::pg_catalog.text) COLLATE pg_catalog."C" AS r, @NT@ AS t FROM fence_new n) q;
    ELSIF TG_OP OPERATOR(pg_catalog.=) 'DELETE' THEN
        SELECT pg_catalog.array_agg(q.r), pg_catalog.array_agg((regj OPERATOR(pg_catalog.->>) q.r)::pg_catalog.int8) INTO rs, ts FROM (
            SELECT DISTINCT (pre OPERATOR(pg_catalog.||) o.@R@::pg_catalog.text) COLLATE pg_catalog."C" AS r FROM fence_old o) q;
    ELSE
$s$,
        CASE WHEN tcol IS NOT NULL THEN
$s$
        SELECT pg_catalog.array_agg(q.r), pg_catalog.array_agg(q.t) INTO rs, ts FROM (
            SELECT DISTINCT (pre OPERATOR(pg_catalog.||) n.@R@::pg_catalog.text) COLLATE pg_catalog."C" AS r, n.@T@ AS t FROM fence_new n
            UNION ALL
            SELECT g.r, (regj OPERATOR(pg_catalog.->>) g.r)::pg_catalog.int8 FROM (
                SELECT DISTINCT (pre OPERATOR(pg_catalog.||) o.@R@::pg_catalog.text) COLLATE pg_catalog."C" AS r FROM fence_old o) g
             WHERE NOT EXISTS (SELECT FROM fence_new n
                                WHERE (pre OPERATOR(pg_catalog.||) n.@R@::pg_catalog.text) COLLATE pg_catalog."C" OPERATOR(pg_catalog.=) g.r)) q;
$s$
        ELSE
$s$
        SELECT pg_catalog.array_agg(q.r), pg_catalog.array_agg((regj OPERATOR(pg_catalog.->>) q.r)::pg_catalog.int8) INTO rs, ts FROM (
            SELECT (pre OPERATOR(pg_catalog.||) n.@R@::pg_catalog.text) COLLATE pg_catalog."C" AS r FROM fence_new n
            UNION
            SELECT (pre OPERATOR(pg_catalog.||) o.@R@::pg_catalog.text) COLLATE pg_catalog."C" FROM fence_old o) q;
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
            IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed' THEN
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
$s$),
        '@NT@', CASE WHEN tcol IS NOT NULL THEN 'n.@T@'
                     ELSE '(regj OPERATOR(pg_catalog.->>) ((pre OPERATOR(pg_catalog.||) n.@R@::pg_catalog.text) COLLATE pg_catalog."C"))::pg_catalog.int8' END),
        '@R@', pg_catalog.quote_ident(rcol)),
        -- @T@ occurs only with a token column (in @NT@'s expansion too, so
        -- this replace comes last)
        '@T@', COALESCE(pg_catalog.quote_ident(tcol), ''))
$f$;

-- The per-row guard for resource column rcol and token column tcol:
-- fence._rows_<md5>(), created on first use. SECURITY DEFINER for the same
-- reason as fence._guard_function: the body is a pure function of the two
-- names, so a caller can only ever create the same function for them.
CREATE FUNCTION fence._rows_function(rcol name, tcol name) RETURNS regprocedure
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    fname text := '_rows_' || md5(format('%I,%s', rcol, coalesce(quote_ident(tcol), '')));
    fn    regprocedure;
    rl    name;
BEGIN
    PERFORM pg_advisory_xact_lock(fence._gate_key('guard function ' || fname));
    fn := to_regprocedure(format('fence.%I()', fname));
    IF fn IS NULL THEN
        EXECUTE format('CREATE FUNCTION fence.%I() RETURNS trigger LANGUAGE plpgsql VOLATILE AS %L', fname, fence._rows_source(rcol, tcol));
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

-- TRUNCATE of a per-row table: it removes the rows of every resource the
-- table holds, so it needs the token fence.use_token registered for each of
-- them (read under TRUNCATE's ACCESS EXCLUSIVE lock with a fresh READ
-- COMMITTED snapshot, so no row can come or go meanwhile; other isolation
-- levels are refused, see below). An empty table truncates freely.
CREATE FUNCTION fence._rows_truncate() RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    rs  text[];
    ts  bigint[];
    reg jsonb := nullif(current_setting('fence.tokens', true), '')::jsonb;
BEGIN
    -- The rows are read with a snapshot of the transaction's: under
    -- REPEATABLE READ or SERIALIZABLE it may predate rows that TRUNCATE
    -- removes all the same, whose resources would then go unchecked.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'pgfence: TRUNCATE of per-row protected table % needs READ COMMITTED', TG_RELID::regclass
            USING ERRCODE = '0A000',
                  HINT = 'under REPEATABLE READ or SERIALIZABLE the rows of resources granted after the snapshot would go unchecked: truncate under READ COMMITTED, or DELETE';
    END IF;
    EXECUTE format('SELECT array_agg(DISTINCT (%L || %I::text) COLLATE "C") FROM %s', TG_ARGV[0], TG_ARGV[2], TG_RELID::regclass) INTO rs;
    IF rs IS NOT NULL THEN
        ts := ARRAY(SELECT (reg ->> u.r)::bigint FROM unnest(rs) WITH ORDINALITY AS u(r, i) ORDER BY u.i);
        PERFORM fence._check_many(rs, ts, TG_OP, TG_RELID);
    END IF;
    RETURN NULL;
END
$$;

-- ---------------------------------------------------------------------------
-- protect, protect_rows
-- ---------------------------------------------------------------------------

-- The checks fence.protect and fence.protect_rows share: tbl is a plain
-- table outside schema fence, with no parent and no children.
CREATE FUNCTION fence._protectable(tbl regclass) RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c record;
BEGIN
    SELECT r.relkind, n.nspname INTO c
      FROM pg_class r JOIN pg_namespace n ON n.oid = r.relnamespace WHERE r.oid = tbl;
    IF c.nspname = 'fence' THEN
        RAISE EXCEPTION 'pgfence: % belongs to the kit itself and cannot be protected', tbl
            USING ERRCODE = '42809', HINT = 'protect your application''s tables';
    END IF;
    IF c.relkind <> 'r' THEN
        RAISE EXCEPTION 'pgfence: % is not an ordinary table', tbl
            USING ERRCODE = '42809', HINT = 'protect a plain table; partitioned tables and views cannot be protected';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = tbl OR i.inhparent = tbl) THEN
        RAISE EXCEPTION 'pgfence: % is part of an inheritance or partition tree', tbl
            USING ERRCODE = '42809', HINT = 'protect a plain table with no parent and no children (it may be attached as a partition afterwards)';
    END IF;
END
$$;

-- Raises unless column col of tbl (qualified name qn) can be a token column:
-- it exists, is not generated, and is bigint or a domain over bigint without
-- constraints (the guard stores an assigned token negated for an instant).
CREATE FUNCTION fence._check_token_column(tbl regclass, qn text, col name) RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    typ oid;
    dom oid;
BEGIN
    SELECT a.atttypid INTO typ FROM pg_attribute a
     WHERE a.attrelid = tbl AND a.attname = col AND a.attnum > 0 AND NOT a.attisdropped;
    IF typ IS NULL THEN
        RAISE EXCEPTION 'pgfence: column % of table % does not exist', col, tbl
            USING ERRCODE = '42703', HINT = 'pass the name of the table''s bigint token column, or NULL to use fence.use_token';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = tbl AND a.attname = col AND a.attgenerated <> '') THEN
        RAISE EXCEPTION 'pgfence: token column % of table % is a generated column', col, tbl
            USING ERRCODE = '42809', HINT = 'a write presents its token by assigning the column: use a plain bigint column';
    END IF;
    WHILE (SELECT t.typtype FROM pg_type t WHERE t.oid = typ) = 'd' LOOP
        dom := typ;
        IF EXISTS (SELECT 1 FROM pg_constraint k WHERE k.contypid = dom) THEN
            RAISE EXCEPTION 'pgfence: token column % of table % has domain type % with a constraint', col, tbl, dom::regtype
                USING ERRCODE = '42804', HINT = format('use plain bigint: ALTER TABLE %s ALTER COLUMN %I TYPE bigint', qn, col);
        END IF;
        typ := (SELECT t.typbasetype FROM pg_type t WHERE t.oid = typ);
    END LOOP;
    IF typ <> 'pg_catalog.int8'::regtype::oid THEN
        RAISE EXCEPTION 'pgfence: token column % of table % has type %, not bigint', col, tbl, typ::regtype
            USING ERRCODE = '42804', HINT = format('tokens need 63 bits: ALTER TABLE %s ALTER COLUMN %I TYPE bigint', qn, col);
    END IF;
END
$$;

-- Makes every later grant exceed the largest token column col of tbl holds
-- (rows restored from a dump, or written before a re-install). Call it after
-- the guard triggers exist (CREATE TRIGGER has locked writers out). Moving
-- the token epoch needs fence._raise_floor: the kit's owner or an operator.
CREATE FUNCTION fence._floor_from_column(tbl regclass, qn text, col name) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    floor bigint;
BEGIN
    EXECUTE format('SELECT max(%I) FROM %s', col, qn) INTO floor;
    IF floor > fence._token_floor() THEN
        IF NOT has_function_privilege('fence._raise_floor(bigint)', 'EXECUTE') THEN
            RAISE EXCEPTION 'pgfence: column % of % holds token %, above every token granted so far', col, tbl, floor
                USING ERRCODE = '42501',
                      HINT = 'the rows come from a restore or an earlier install: have the kit''s owner or an operator run this protect again, so later grants exceed them';
        END IF;
        PERFORM fence._raise_floor(floor);
    END IF;
END
$$;

-- Drops every guard trigger of tbl (qualified name qn), of any form and
-- version.
CREATE FUNCTION fence._drop_guards(tbl regclass, qn text) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    tg name;
BEGIN
    FOR tg IN SELECT fence._guard_triggers(tbl) LOOP
        EXECUTE format('DROP TRIGGER %I ON %s', tg, qn);
    END LOOP;
END
$$;

-- fence.protect as in 003, its checks moved into the helpers above (same
-- checks, same errors, same order).
CREATE OR REPLACE FUNCTION fence.protect(tbl regclass, resource text, token_column name DEFAULT NULL) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    qn text;
    fn regprocedure;
BEGIN
    qn := fence._owned_table(tbl, 'protect');
    PERFORM fence._check_name('resource', resource);
    PERFORM fence._protectable(tbl);
    IF token_column IS NOT NULL THEN
        PERFORM fence._check_token_column(tbl, qn, token_column);
        fn := fence._guard_function(token_column);
    END IF;
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
    IF token_column IS NOT NULL THEN
        PERFORM fence._floor_from_column(tbl, qn, token_column);
    END IF;
END
$$;

-- Guards tbl per row: the resource of a row is resource_prefix ||
-- resource_column::text. See fence._rows_source for the triggers and
-- docs/sql.md, "Per-row resources", for the rules. Runs with the caller's
-- rights: only the table's owner may protect it.
CREATE FUNCTION fence.protect_rows(tbl regclass, resource_column name, resource_prefix text DEFAULT '', token_column name DEFAULT NULL) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    qn  text;
    fn  regprocedure;
    a   record;
    tc  text := coalesce(token_column, '');
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
    fn := fence._rows_function(resource_column, token_column);

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
    EXECUTE format('CREATE TRIGGER "~fence_rows_3_pin" AFTER DELETE ON %s REFERENCING OLD TABLE AS fence_old FOR EACH ROW WHEN (false) EXECUTE FUNCTION %s(%L, %L, %L)',
                   qn, fn::regproc, resource_prefix, tc, resource_column);
    EXECUTE format('CREATE TRIGGER zz_fence_guard_stmt BEFORE TRUNCATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION fence._rows_truncate(%L, %L, %L)',
                   qn, resource_prefix, tc, resource_column);
    IF token_column IS NOT NULL THEN
        PERFORM fence._floor_from_column(tbl, qn, token_column);
    END IF;
END
$$;
COMMENT ON FUNCTION fence.protect_rows(regclass, name, text, name) IS
    'guards tbl per row: a write must present the latest token of resource_prefix || resource_column of every row it writes';

CREATE OR REPLACE FUNCTION fence.unprotect(tbl regclass) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM fence._drop_guards(tbl, fence._owned_table(tbl, 'unprotect'));
END
$$;

-- ---------------------------------------------------------------------------
-- Views and privileges
-- ---------------------------------------------------------------------------

-- As in 003, plus form ('table' for fence.protect, 'rows' for
-- fence.protect_rows) and resource_column. For a per-row table, resource is
-- the prefix of its resources' names.
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
       (max(fence._trigger_arg(t.tgargs, 2)) FILTER (WHERE t.tgname = '~fence_rows_2_upd'))::name AS resource_column
  FROM pg_catalog.pg_trigger t
 WHERE t.tgname IN ('zz_fence_guard_row', '~fence_guard_1_row', 'zz_fence_guard_stmt', '~fence_rows_2_upd')
   AND t.tgfoid IN (SELECT p.oid FROM pg_catalog.pg_proc p WHERE p.pronamespace = 'fence'::pg_catalog.regnamespace)
 GROUP BY t.tgrelid, fence._trigger_arg(t.tgargs, 0);
COMMENT ON VIEW fence.protected IS
    'every table guarded by fence.protect (form table: resource) or fence.protect_rows (form rows: resource is the prefix, resource_column names the rest), its token column (NULL: fence.use_token), and the roles other than the owner that can create triggers on it';

-- As in 003, plus what per-row tables need: fence.protect_rows and its
-- helpers, fence._check_many and fence._rows_truncate for writers, and the
-- generated per-row guards.
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
        fence._guard_function(name), fence._rows_function(name, name), fence._token_floor(), fence._guard_triggers(regclass),
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

-- Gives every role that holds the kit's usage itself (not through
-- membership: a member must lose it with the membership) what the current
-- fence.grant_usage grants; operators stay operators. A migration that adds
-- functions for writers calls this after replacing fence.grant_usage.
CREATE FUNCTION fence._regrant_usage() RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT a.rolname,
                    EXISTS (SELECT 1 FROM pg_proc p, aclexplode(p.proacl) x
                             WHERE p.oid = 'fence.revoke(text)'::regprocedure
                               AND x.grantee = a.oid AND x.privilege_type = 'EXECUTE') AS op
               FROM pg_roles a
              WHERE EXISTS (SELECT 1 FROM pg_proc p, aclexplode(p.proacl) x
                             WHERE p.oid = 'fence.use_token(text, bigint)'::regprocedure
                               AND x.grantee = a.oid AND x.privilege_type = 'EXECUTE')
                AND NOT pg_has_role(a.oid, (SELECT n.nspowner FROM pg_namespace n WHERE n.nspname = 'fence'), 'USAGE')
                AND NOT a.rolsuper LOOP
        PERFORM fence.grant_usage(r.rolname, r.op);
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION fence.version() RETURNS integer
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT 4 $$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA fence FROM PUBLIC;

SELECT fence._regrant_usage();
