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

-- ---------------------------------------------------------------------------
-- 4. Guard functions
-- ---------------------------------------------------------------------------

-- ---------------------------------------------------------------------------
-- 9. Version
-- ---------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION fence.version() RETURNS integer
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT 8 $$;
COMMENT ON FUNCTION fence.version() IS 'the migration version of the installed pgfence schema';
