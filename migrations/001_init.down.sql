-- pgfence 001 down: removes schema fence and everything in it.
--
-- Refuses while any table is still guarded: dropping the guard functions would
-- silently turn fencing off for tables an application relies on (and the
-- guard triggers depend on those functions, so they could not be left
-- behind calling nothing). Unprotect the tables first.
DO $$
DECLARE
    tables text;
BEGIN
    SELECT string_agg(DISTINCT t.tgrelid::regclass::text, ', ') INTO tables
      FROM pg_catalog.pg_trigger t
      JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid
      JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
     WHERE n.nspname = 'fence'
       AND t.tgrelid NOT IN (SELECT c.oid FROM pg_catalog.pg_class c WHERE c.relnamespace = 'fence'::regnamespace);
    IF tables IS NOT NULL THEN
        RAISE EXCEPTION 'pgfence: cannot remove schema fence while tables are protected: %', tables
            USING ERRCODE = '2BP01',
                  HINT = 'run SELECT fence.unprotect(''TABLE'') for each (as the table''s owner), then migrate down again; '
                         'golang-migrate marks the version dirty after this failure: force it back to 1 first (pgfence migrate force 1)';
    END IF;
    -- Inside the same block, so that a client that goes on after an error
    -- (psql without ON_ERROR_STOP) cannot drop the schema after the refusal.
    DROP SCHEMA fence CASCADE;
END
$$;
