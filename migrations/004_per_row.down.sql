-- Back to pgfence 003. Refused while a table is protected per row (003 has
-- no guard for it, and dropping its guard silently would let every write
-- through): run fence.unprotect on those tables first, or protect them with
-- fence.protect.
DO $$
DECLARE
    t text;
BEGIN
    SELECT string_agg(p.tbl::text, ', ') INTO t FROM fence.protected p WHERE p.form = 'rows';
    IF t IS NOT NULL THEN
        RAISE EXCEPTION 'pgfence: cannot go back to migration 3 while tables are protected per row: %', t
            USING ERRCODE = '55000', HINT = 'run SELECT fence.unprotect(table) on each (or fence.protect it table-wide) first';
    END IF;
END
$$;

-- 003's fence.protect and fence.unprotect (their checks inline again).
CREATE OR REPLACE FUNCTION fence.protect(tbl regclass, resource text, token_column name DEFAULT NULL) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    c     record;
    tg    name;
    typ   oid;
    dom   oid;
    qn    text;
    fn    regprocedure;
    floor bigint;
BEGIN
    qn := fence._owned_table(tbl, 'protect');
    PERFORM fence._check_name('resource', resource);
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
    -- As in 001: refuse both sides of an existing inheritance or partition
    -- tree (a table attached later stays guarded: row triggers fire on the
    -- table that holds the row).
    IF EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = tbl OR i.inhparent = tbl) THEN
        RAISE EXCEPTION 'pgfence: % is part of an inheritance or partition tree', tbl
            USING ERRCODE = '42809', HINT = 'protect a plain table with no parent and no children (it may be attached as a partition afterwards)';
    END IF;
    IF token_column IS NOT NULL THEN
        SELECT a.atttypid INTO typ FROM pg_attribute a
         WHERE a.attrelid = tbl AND a.attname = token_column AND a.attnum > 0 AND NOT a.attisdropped;
        IF typ IS NULL THEN
            RAISE EXCEPTION 'pgfence: column % of table % does not exist', token_column, tbl
                USING ERRCODE = '42703', HINT = 'pass the name of the table''s bigint token column, or NULL to use fence.use_token';
        END IF;
        IF EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = tbl AND a.attname = token_column AND a.attgenerated <> '') THEN
            RAISE EXCEPTION 'pgfence: token column % of table % is a generated column', token_column, tbl
                USING ERRCODE = '42809', HINT = 'a write presents its token by assigning the column: use a plain bigint column';
        END IF;
        -- A domain over bigint is fine if it has no CHECK constraint: the
        -- guard stores the assigned token negated for an instant (see
        -- fence._guard_source), which a CHECK on the domain would refuse.
        WHILE (SELECT t.typtype FROM pg_type t WHERE t.oid = typ) = 'd' LOOP
            dom := typ;
            IF EXISTS (SELECT 1 FROM pg_constraint k WHERE k.contypid = dom) THEN
                RAISE EXCEPTION 'pgfence: token column % of table % has domain type % with a constraint', token_column, tbl, dom::regtype
                    USING ERRCODE = '42804', HINT = format('use plain bigint: ALTER TABLE %s ALTER COLUMN %I TYPE bigint', qn, token_column);
            END IF;
            typ := (SELECT t.typbasetype FROM pg_type t WHERE t.oid = typ);
        END LOOP;
        IF typ <> 'pg_catalog.int8'::regtype::oid THEN
            RAISE EXCEPTION 'pgfence: token column % of table % has type %, not bigint', token_column, tbl, typ::regtype
                USING ERRCODE = '42804', HINT = format('tokens need 63 bits: ALTER TABLE %s ALTER COLUMN %I TYPE bigint', qn, token_column);
        END IF;
        fn := fence._guard_function(token_column);
    END IF;

    FOR tg IN SELECT fence._guard_triggers(tbl) LOOP
        EXECUTE format('DROP TRIGGER %I ON %s', tg, qn);
    END LOOP;
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

    -- The floor, read after CREATE TRIGGER locked out concurrent writers.
    IF token_column IS NOT NULL THEN
        EXECUTE format('SELECT max(%I) FROM %s', token_column, qn) INTO floor;
        IF floor > fence._token_floor() THEN
            IF NOT has_function_privilege('fence._raise_floor(bigint)', 'EXECUTE') THEN
                RAISE EXCEPTION 'pgfence: column % of % holds token %, above every token granted so far', token_column, tbl, floor
                    USING ERRCODE = '42501',
                          HINT = 'the rows come from a restore or an earlier install: have the kit''s owner or an operator run this fence.protect, so later grants exceed them';
            END IF;
            PERFORM fence._raise_floor(floor);
        END IF;
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION fence.unprotect(tbl regclass) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    qn text := fence._owned_table(tbl, 'unprotect');
    tg name;
BEGIN
    FOR tg IN SELECT fence._guard_triggers(tbl) LOOP
        EXECUTE format('DROP TRIGGER %I ON %s', tg, qn);
    END LOOP;
END
$$;

-- 003's view: no form, no resource_column.
DROP VIEW fence.protected;
CREATE VIEW fence.protected AS
SELECT t.tgrelid::regclass AS tbl,
       fence._trigger_arg(t.tgargs, 0) AS resource,
       (max(fence._trigger_arg(t.tgargs, 1)) FILTER (WHERE t.tgname IN ('zz_fence_guard_row', '~fence_guard_1_row')))::name AS token_column,
       (SELECT pg_catalog.array_agg(r.rolname ORDER BY r.rolname)
          FROM pg_catalog.pg_roles r, pg_catalog.pg_class c
         WHERE c.oid = t.tgrelid
           AND NOT r.rolsuper
           AND NOT pg_catalog.pg_has_role(r.oid, c.relowner, 'USAGE')
           AND pg_catalog.has_table_privilege(r.oid, t.tgrelid, 'TRIGGER')) AS trigger_roles
  FROM pg_catalog.pg_trigger t
 WHERE t.tgname IN ('zz_fence_guard_row', '~fence_guard_1_row', 'zz_fence_guard_stmt')
   AND t.tgfoid IN (SELECT p.oid FROM pg_catalog.pg_proc p WHERE p.pronamespace = 'fence'::pg_catalog.regnamespace)
 GROUP BY t.tgrelid, fence._trigger_arg(t.tgargs, 0);
COMMENT ON VIEW fence.protected IS
    'every table guarded by fence.protect: resource, token column (NULL: fence.use_token), and the roles other than the owner that can create triggers on it';

-- 003's fence.grant_usage.
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
        fence._guard_row(), fence._guard_stmt(), fence._guard_use_token(),
        fence._registered_token(text, text, oid),
        fence._check_name(text, text), fence._lease_key(text, bigint), fence._gate_key(text), fence._trigger_arg(bytea, integer),
        fence._guard_function(name), fence._token_floor(), fence._guard_triggers(regclass), fence._owned_table(regclass, text),
        fence.lock_key(text), fence.try_lock(text), fence.unlock(text),
        fence.try_xact_lock(text), fence.version() TO %I', role);
    FOR fn IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
               WHERE p.pronamespace = 'fence'::pg_catalog.regnamespace AND p.proname ~ '^_guard_[0-9a-f]{32}$' LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', fn, role);
    END LOOP;
    IF operator THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION fence.revoke(text), fence._raise_floor(bigint) TO %I', role);
    END IF;
END
$$;

DO $$
DECLARE
    fn regprocedure;
BEGIN
    FOR fn IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
               WHERE p.pronamespace = 'fence'::pg_catalog.regnamespace AND p.proname ~ '^_rows_[0-9a-f]{32}$' LOOP
        EXECUTE format('DROP FUNCTION %s', fn);
    END LOOP;
END
$$;
DROP FUNCTION fence.protect_rows(regclass, name, text, name);
DROP FUNCTION fence._rows_function(name, name);
DROP FUNCTION fence._rows_source(name, name);
DROP FUNCTION fence._rows_truncate();
DROP FUNCTION fence._check_many(text[], bigint[], text, oid);
DROP FUNCTION fence._protectable(regclass);
DROP FUNCTION fence._check_token_column(regclass, text, name);
DROP FUNCTION fence._floor_from_column(regclass, text, name);
DROP FUNCTION fence._drop_guards(regclass, text);

CREATE OR REPLACE FUNCTION fence.version() RETURNS integer
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT 3 $$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA fence FROM PUBLIC;
REVOKE ALL ON fence.protected FROM PUBLIC;

-- Roles with the kit's usage get exactly what 003's fence.grant_usage gives
-- (the view was re-created, and the functions above are gone).
DO $$
BEGIN
    PERFORM fence._regrant_usage();
END
$$;
DROP FUNCTION fence._regrant_usage();
