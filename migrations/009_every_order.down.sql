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
-- 9. Version
-- ---------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION fence.version() RETURNS integer
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT 8 $$;
COMMENT ON FUNCTION fence.version() IS 'the migration version of the installed pgfence schema';
