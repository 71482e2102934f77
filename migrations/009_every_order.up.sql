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
-- 9. Version
-- ---------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION fence.version() RETURNS integer
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT 9 $$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA fence FROM PUBLIC;
SELECT fence._regrant_usage();
