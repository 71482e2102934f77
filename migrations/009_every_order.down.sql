-- pgfence 009 down: back to 008 exactly (each section puts back what the
-- same section of the up replaced).

-- ---------------------------------------------------------------------------
-- 1. The grant and the check
-- ---------------------------------------------------------------------------

-- The revoked rows stay revoked (their new tokens are larger: harmless).
ALTER TABLE fence.lease DROP CONSTRAINT lease_token_key;

-- ---------------------------------------------------------------------------
-- 2. Epochs: restores and the counter's budget
-- ---------------------------------------------------------------------------

-- 008's fence.grant_usage, fence._cache_epoch and fence._epoch (which no
-- longer write or read the columns dropped below), then the columns and the
-- helpers.
DROP FUNCTION fence.token_budget();
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

CREATE OR REPLACE FUNCTION fence._cache_epoch(c fence.epoch_cache) RETURNS bigint
LANGUAGE sql VOLATILE
AS $$
    SELECT CASE WHEN c.system_identifier OPERATOR(pg_catalog.=) fence._system_identifier()
                 AND c.datoid OPERATOR(pg_catalog.=) fence._database_oid()
                 AND c.relid OPERATOR(pg_catalog.=) 'fence.epoch_state'::pg_catalog.regclass::pg_catalog.oid
                 AND c.timeline OPERATOR(pg_catalog.=) fence._timeline()
                 AND c.base OPERATOR(pg_catalog.+) c.timeline OPERATOR(pg_catalog.<) (1::pg_catalog.int8 OPERATOR(pg_catalog.<<) 20)
                 AND c.base OPERATOR(pg_catalog.+) c.timeline OPERATOR(pg_catalog.>=) pg_catalog.pg_sequence_last_value('fence.epoch_floor'::pg_catalog.regclass)
           THEN c.base OPERATOR(pg_catalog.+) c.timeline END
$$;

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
    floor bigint;
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
    floor := pg_catalog.pg_sequence_last_value('fence.epoch_floor'::pg_catalog.regclass);
    IF nbase + tli < floor THEN
        nbase := floor - tli;
        UPDATE fence.epoch_state SET base = nbase;
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
    DELETE FROM fence.epoch_cache;
    INSERT INTO fence.epoch_cache (system_identifier, datoid, relid, timeline, base)
    VALUES (sysid, mydb, myrel, tli, nbase);
    RETURN nbase + tli;
END
$$;

ALTER TABLE fence.origin DROP COLUMN row_xact, DROP COLUMN kit_xact, DROP COLUMN backup_label;
ALTER TABLE fence.epoch_cache DROP COLUMN row_xact, DROP COLUMN kit_xact;
DROP FUNCTION fence._backup_label();
DROP FUNCTION fence._row_xact();

-- ---------------------------------------------------------------------------
-- 3. Refusal counts
-- ---------------------------------------------------------------------------

CREATE OR REPLACE VIEW fence.refusals AS
SELECT 'FN001'::text AS sqlstate, 'stale token'::text AS reason,
       CASE WHEN s.is_called THEN s.last_value ELSE 0 END AS count FROM fence.refusals_fn001 s
UNION ALL
SELECT 'FN002', 'no token', CASE WHEN s.is_called THEN s.last_value ELSE 0 END FROM fence.refusals_fn002 s
UNION ALL
SELECT 'FN003', 'token never granted', CASE WHEN s.is_called THEN s.last_value ELSE 0 END FROM fence.refusals_fn003 s;

CREATE OR REPLACE FUNCTION fence._refuse(code text, message text, detail text, hint text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF current_setting('transaction_read_only') = 'off' THEN
        PERFORM nextval(CASE code WHEN 'FN001' THEN 'fence.refusals_fn001'::regclass
                                  WHEN 'FN002' THEN 'fence.refusals_fn002'::regclass
                                  WHEN 'FN003' THEN 'fence.refusals_fn003'::regclass END);
    END IF;
    RAISE EXCEPTION USING ERRCODE = code, MESSAGE = message, DETAIL = detail, HINT = hint;
END
$$;

DROP TABLE fence.refusal_marks;

-- ---------------------------------------------------------------------------
-- 4. Guard functions
-- ---------------------------------------------------------------------------

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

DROP FUNCTION fence._drop_unused_guards(text);

-- ---------------------------------------------------------------------------
-- 6. The grant made leaner
-- ---------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION fence.acquire(resource text, holder text, ttl interval, waiting boolean DEFAULT false) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    secs double precision := pg_catalog.date_part('epoch', ttl);
BEGIN
    IF fence._name_ok(resource) AND fence._name_ok(holder) AND fence._ttl_ok(secs) THEN
        RETURN fence._grant(resource, holder, 'ttl', pg_catalog.make_interval(secs => secs), false, coalesce(waiting, false));
    END IF;
    PERFORM fence._check_name('resource', resource);
    PERFORM fence._check_name('holder', holder);
    RETURN fence._grant(resource, holder, 'ttl', fence._check_ttl(ttl), false, coalesce(waiting, false));
END
$$;

-- ---------------------------------------------------------------------------
-- 5. Per-row guard and producers
-- ---------------------------------------------------------------------------

-- Every per-row table guarded by section 5's functions gets 008's guard
-- back (008's generated functions were never dropped). The migrating role
-- must own them all: the down refuses, changing nothing, and names the
-- others.
DO $$
DECLARE
    others text;
BEGIN
    SELECT pg_catalog.string_agg(t.tgrelid::pg_catalog.regclass::pg_catalog.text, ', ' ORDER BY t.tgrelid::pg_catalog.regclass::pg_catalog.text) INTO others
      FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid
     WHERE t.tgname = '~fence_rows_2_kids' AND NOT pg_catalog.pg_has_role(CURRENT_USER, c.relowner, 'USAGE');
    IF others IS NOT NULL THEN
        RAISE EXCEPTION 'pgfence: the down of migration 9 re-protects every per-row table, and % does not own %', CURRENT_USER, others
            USING ERRCODE = '42501', HINT = 'run the down as a role that owns those tables (or is a member of their owners), or as a superuser';
    END IF;
END
$$;

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




DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT t.tgrelid::pg_catalog.regclass AS tbl, fence._trigger_arg(t.tgargs, 0) AS pre,
                    NULLIF(fence._trigger_arg(t.tgargs, 1), '')::pg_catalog.name AS tcol,
                    fence._trigger_arg(t.tgargs, 2)::pg_catalog.name AS rcol
               FROM pg_catalog.pg_trigger t
              WHERE t.tgname = '~fence_rows_2_kids' ORDER BY 1 LOOP
        PERFORM fence.protect_rows(r.tbl, r.rcol, r.pre, r.tcol);
    END LOOP;
END
$$;

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
       (SELECT pg_catalog.bool_and(g.tgenabled IN ('O', 'A')) FROM pg_catalog.pg_trigger g JOIN pg_catalog.pg_proc p ON p.oid = g.tgfoid
         WHERE g.tgrelid = t.tgrelid AND p.pronamespace = 'fence'::pg_catalog.regnamespace AND NOT g.tgisinternal) AS enabled
  FROM pg_catalog.pg_trigger t
 WHERE t.tgname IN ('zz_fence_guard_row', '~fence_guard_1_row', 'zz_fence_guard_stmt', '~fence_rows_2_upd')
   AND t.tgfoid IN (SELECT p.oid FROM pg_catalog.pg_proc p WHERE p.pronamespace = 'fence'::pg_catalog.regnamespace)
 GROUP BY t.tgrelid, fence._trigger_arg(t.tgargs, 0);

DO $$
DECLARE
    fn pg_catalog.regprocedure;
BEGIN
    FOR fn IN SELECT p.oid::pg_catalog.regprocedure FROM pg_catalog.pg_proc p
               WHERE p.pronamespace = 'fence'::pg_catalog.regnamespace AND p.proname ~ '^_rows_[0-9a-f]{32}$'
                 AND pg_catalog.obj_description(p.oid, 'pg_proc') ~ 'fence\._rows9_(mark_)?source\(' LOOP
        EXECUTE pg_catalog.format('DROP FUNCTION %s', fn);
    END LOOP;
END
$$;
DROP FUNCTION fence.allow_producers(regclass, boolean);
DROP FUNCTION fence._rows9_triggers(regclass, text, regprocedure, name, text, name, boolean);
DROP FUNCTION fence._rows9_function(regclass, name, name);
DROP FUNCTION fence._rows9_source(name, name);
DROP FUNCTION fence._rows9_mark_source(name, name);
DROP FUNCTION fence._rows_kids();
DROP FUNCTION fence._rows_slow(text, bigint, text, oid, boolean, boolean);
DROP FUNCTION fence._lock_check(text, bigint);

-- ---------------------------------------------------------------------------
-- 9. Version
-- ---------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION fence.version() RETURNS integer
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT 8 $$;
COMMENT ON FUNCTION fence.version() IS 'the migration version of the installed pgfence schema';
