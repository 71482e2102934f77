-- pgfence 006: the grant no longer takes the cluster's identity from a
-- setting the caller can write.
--
-- A restored copy of the kit is recognised by its state row
-- (fence.epoch_state), which names the cluster it was written on by its
-- system identifier. Since 002 the grant's unlocked fast path
-- (fence._state_epoch since 005) compared that identifier with a per-session
-- cache kept in the setting fence._system_identifier, which any role can SET.
-- A role that set it to the source cluster's identifier kept a data-only
-- restore into an identically migrated fresh cluster on the source's epoch,
-- and so could be granted tokens the source had granted after the dump
-- (TestForgedSystemIdentifierSettingDoesNotHideARestore; docs/design.md,
-- "Why an epoch, and where it comes from").
--
-- This migration replaces two pieces and nothing else:
--   fence._system_identifier()  the identifier, without a setting
--   fence._state_epoch(s)       compares with it
-- fence._grant still calls fence._system_identifier() on its slow path; that
-- call now only reads the identifier.

-- The system identifier of the cluster this backend runs on. IMMUTABLE,
-- although pg_control_system() reads the control file: a backend never
-- changes clusters, so the value cannot change while any plan that holds
-- it exists (plans live in one backend). The label lets the planner
-- evaluate the call once when it plans the expression that contains it
-- (fence._state_epoch inlined into fence._grant), instead of reading the
-- control file on every grant (about 6 us here). Nothing a caller sets
-- takes part. Internal: not for indexes or stored expressions.
CREATE OR REPLACE FUNCTION fence._system_identifier() RETURNS bigint
LANGUAGE sql IMMUTABLE
AS $$
    SELECT (pg_catalog.pg_control_system()).system_identifier
$$;

-- As in 005, comparing the state row's system identifier with
-- fence._system_identifier() instead of the setting.
CREATE OR REPLACE FUNCTION fence._state_epoch(s fence.epoch_state) RETURNS bigint
LANGUAGE sql VOLATILE
AS $$
    SELECT CASE WHEN s.system_identifier OPERATOR(pg_catalog.=) fence._system_identifier()
                 AND s.relid OPERATOR(pg_catalog.=) 'fence.epoch_state'::pg_catalog.regclass::pg_catalog.oid
                 AND s.timeline OPERATOR(pg_catalog.=) fence._timeline()
                 AND s.base OPERATOR(pg_catalog.+) s.timeline OPERATOR(pg_catalog.<) (1::pg_catalog.int8 OPERATOR(pg_catalog.<<) 20)
           THEN s.base OPERATOR(pg_catalog.+) s.timeline END
$$;

CREATE OR REPLACE FUNCTION fence.version() RETURNS integer
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT 6 $$;
