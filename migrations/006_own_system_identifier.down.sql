-- Back to pgfence 005: fence._system_identifier as 002 wrote it (the
-- per-session cache in the setting fence._system_identifier) and
-- fence._state_epoch as 005 wrote it.

CREATE OR REPLACE FUNCTION fence._system_identifier() RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v   text := pg_catalog.current_setting('fence._system_identifier', true);
    sys bigint;
BEGIN
    IF v IS NOT NULL AND v <> '' THEN
        RETURN v::bigint;
    END IF;
    sys := (pg_catalog.pg_control_system()).system_identifier;
    PERFORM pg_catalog.set_config('fence._system_identifier', sys::text, false);
    RETURN sys;
END
$$;

CREATE OR REPLACE FUNCTION fence._state_epoch(s fence.epoch_state) RETURNS bigint
LANGUAGE sql VOLATILE
AS $$
    SELECT CASE WHEN s.system_identifier::pg_catalog.text OPERATOR(pg_catalog.=) pg_catalog.current_setting('fence._system_identifier', true)
                 AND s.relid OPERATOR(pg_catalog.=) 'fence.epoch_state'::pg_catalog.regclass::pg_catalog.oid
                 AND s.timeline OPERATOR(pg_catalog.=) fence._timeline()
                 AND s.base OPERATOR(pg_catalog.+) s.timeline OPERATOR(pg_catalog.<) (1::pg_catalog.int8 OPERATOR(pg_catalog.<<) 20)
           THEN s.base OPERATOR(pg_catalog.+) s.timeline END
$$;

CREATE OR REPLACE FUNCTION fence.version() RETURNS integer
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT 5 $$;
