-- pgfence 005: the grant in small pieces, and every constraint named.
--
-- Behaviour does not change. fence._grant (shipped whole by 001, 002 and
-- 003) becomes a short function over helpers with one job each, so that a
-- later migration replaces the piece it changes and nothing else:
--
--   fence._force_durable()     synchronous_commit on for this transaction
--                              (the one copy of what _grant, fence.renew
--                              and fence._durable each wrote out before)
--   fence._grant_wait()        fence.grant_wait, read (and checked by
--                              fence._wait_ms when it is set)
--   fence._lock_lease(...)     the resource's gate and lease row, locked
--   fence._state_epoch(...)    the current epoch from the state row, if it
--                              is known good
--   fence._next_token(...)     the next token (003, unchanged)
--
-- Why the grant locks what it locks, in that order, waits as long as it
-- does and forces a flush: docs/design.md, "Linearizable fencing", "The grant
-- wait" and "Where a token comes from". What each piece costs, and how a
-- migration should change one: docs/design.md, "How the grant is put
-- together".
--
-- The helpers with no side effects are SQL functions that the planner
-- inlines (an inlined function costs no call; a PL/pgSQL call costs about a
-- microsecond here); the ones that catch errors or keep state are PL/pgSQL.
-- Like every internal helper they carry no SET search_path (they run inside
-- entry points that pin it) and qualify every name and operator
-- (fence._state_epoch inlines 001's fence._timeline, whose body is not
-- qualified: it is safe only inside those pinned entry points, as it was).

-- ---------------------------------------------------------------------------
-- Constraints: names a migration chose
-- ---------------------------------------------------------------------------

-- 001 left the names of three constraints to PostgreSQL, and 002 dropped
-- five by the names PostgreSQL had generated. From here on every constraint
-- in schema fence has a name a migration chose; they are found here by what
-- they are, not by a generated name. (NOT NULL constraints, which
-- PostgreSQL 18 also lists with generated names, are changed by column,
-- never by name: ALTER COLUMN works on every version.)
DO $$
DECLARE
    want record;
    have name;
BEGIN
    FOR want IN SELECT * FROM (VALUES
            ('fence.lease'::pg_catalog.regclass, 'p'::"char", 'lease_pkey'::name),
            ('fence.epoch_state'::pg_catalog.regclass, 'p'::"char", 'epoch_state_pkey'::name),
            ('fence.epoch_state'::pg_catalog.regclass, 'c'::"char", 'epoch_state_one_row'::name)) v(rel, kind, name) LOOP
        SELECT c.conname INTO STRICT have FROM pg_catalog.pg_constraint c
         WHERE c.conrelid OPERATOR(pg_catalog.=) want.rel AND c.contype OPERATOR(pg_catalog.=) want.kind;
        IF have OPERATOR(pg_catalog.<>) want.name THEN
            EXECUTE pg_catalog.format('ALTER TABLE %s RENAME CONSTRAINT %I TO %I', want.rel, have, want.name);
        END IF;
    END LOOP;
END
$$;

-- ---------------------------------------------------------------------------
-- The pieces
-- ---------------------------------------------------------------------------

-- Turns synchronous_commit back on for the rest of the transaction when the
-- caller turned it off, so that what the transaction wrote survives a crash
-- once it has committed (docs/design.md, "Where a token comes from").
-- Returns 'on' when it changed the setting, NULL when it left it. Callers
-- in PL/pgSQL assign the result rather than PERFORM the call: an assignment
-- of an inlined expression skips the executor (about 0.1 microseconds
-- against 0.9 here).
CREATE FUNCTION fence._force_durable() RETURNS text
LANGUAGE sql VOLATILE
AS $$
    SELECT CASE WHEN pg_catalog.current_setting('synchronous_commit') OPERATOR(pg_catalog.=) 'off'
                THEN pg_catalog.set_config('synchronous_commit', 'on', true) END
$$;

-- A setting that names a wait (an interval from 1 ms to 1 hour), in whole
-- milliseconds rounded up; anything else is an error (22023) naming the
-- setting, never a silent default.
CREATE FUNCTION fence._wait_ms(setting text) RETURNS bigint
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    ms pg_catalog.int8;
BEGIN
    BEGIN
        ms := pg_catalog.ceil(pg_catalog.date_part('epoch', setting::pg_catalog.interval) OPERATOR(pg_catalog.*) 1000)::pg_catalog.int8;
    EXCEPTION WHEN data_exception THEN
        ms := NULL;
    END;
    IF ms IS NULL OR ms OPERATOR(pg_catalog.<=) 0 OR ms OPERATOR(pg_catalog.>) 3600000 THEN
        RAISE EXCEPTION 'pgfence: fence.grant_wait = % is not a wait between 1 millisecond and 1 hour', setting
            USING ERRCODE = '22023', HINT = 'SET fence.grant_wait = ''2s'' (an interval), or RESET fence.grant_wait';
    END IF;
    RETURN ms;
END
$$;

-- How long a grant may wait for the resource's gate and lease row, in
-- milliseconds: fence.grant_wait (an interval from 1 ms to 1 hour), 2000
-- when it is not set (docs/design.md, "The grant wait"). SQL, so that the
-- usual case (not set) is inlined into the grant and costs no call.
CREATE FUNCTION fence._grant_wait() RETURNS bigint
LANGUAGE sql STABLE
AS $$
    SELECT CASE WHEN coalesce(pg_catalog.current_setting('fence.grant_wait', true), '') OPERATOR(pg_catalog.=) ''
                THEN 2000::pg_catalog.int8
                ELSE fence._wait_ms(pg_catalog.current_setting('fence.grant_wait', true)) END
$$;

-- Locks res for a grant: its gate (advisory, exclusive, to the end of the
-- transaction), then its lease row FOR UPDATE, in that order (the order and
-- why both: docs/design.md, "Linearizable fencing"). First without waiting;
-- then waiting at most wait_ms, as a lock_timeout on these two locks only
-- (the caller's lock_timeout is restored). locked is false when the wait
-- ran out; otherwise lease is the locked row (all NULL when res has none
-- yet).
CREATE FUNCTION fence._lock_lease(res text, wait_ms bigint, OUT locked boolean, OUT lease fence.lease)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    prev pg_catalog.text;
BEGIN
    IF pg_catalog.pg_try_advisory_xact_lock(fence._gate_key(res)) THEN
        SELECT * INTO lease FROM fence.lease x WHERE x.resource OPERATOR(pg_catalog.=) res FOR UPDATE SKIP LOCKED;
        locked := FOUND OR NOT EXISTS (SELECT 1 FROM fence.lease x WHERE x.resource OPERATOR(pg_catalog.=) res);
        IF locked THEN
            RETURN;
        END IF;
    END IF;
    prev := pg_catalog.current_setting('lock_timeout');
    PERFORM pg_catalog.set_config('lock_timeout', wait_ms::pg_catalog.text, true);
    BEGIN
        PERFORM pg_catalog.pg_advisory_xact_lock(fence._gate_key(res));
        SELECT * INTO lease FROM fence.lease x WHERE x.resource OPERATOR(pg_catalog.=) res FOR UPDATE;
        locked := true;
    EXCEPTION WHEN lock_not_available THEN
        locked := false;
    END;
    PERFORM pg_catalog.set_config('lock_timeout', prev, true);
END
$$;

-- The current epoch read from the state row s without a lock, or NULL when
-- s may not be current: no row yet, another server or database (system
-- identifier cached by fence._system_identifier, the table's OID), another
-- timeline, or the last epoch. NULL sends the grant to fence._epoch, which
-- locks the row and moves the epoch when it must.
CREATE FUNCTION fence._state_epoch(s fence.epoch_state) RETURNS bigint
LANGUAGE sql VOLATILE
AS $$
    SELECT CASE WHEN s.system_identifier::pg_catalog.text OPERATOR(pg_catalog.=) pg_catalog.current_setting('fence._system_identifier', true)
                 AND s.relid OPERATOR(pg_catalog.=) 'fence.epoch_state'::pg_catalog.regclass::pg_catalog.oid
                 AND s.timeline OPERATOR(pg_catalog.=) fence._timeline()
                 AND s.base OPERATOR(pg_catalog.+) s.timeline OPERATOR(pg_catalog.<) (1::pg_catalog.int8 OPERATOR(pg_catalog.<<) 20)
           THEN s.base OPERATOR(pg_catalog.+) s.timeline END
$$;

-- ---------------------------------------------------------------------------
-- The grant, over the pieces
-- ---------------------------------------------------------------------------

-- Grants a new token for resource, to holder (NULL with kind 'revoked'),
-- expiring after ttl (NULL for session leases and revocations). NULL when a
-- live lease exists (unless force) or when the resource stays busy past the
-- grant wait. What it does, step by step, is what 003's did.
CREATE OR REPLACE FUNCTION fence._grant(resource text, holder text, kind text, ttl interval, force boolean, waiting boolean) RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_variable
DECLARE
    r     record;
    k     record;
    l     fence.lease;
    epoch bigint;
    spid  integer;
    now   timestamptz;
    t     bigint;
    durable text;  -- assigned, not PERFORMed: see fence._force_durable
BEGIN
    -- A live lease answers at once, without a lock (pollers never queue).
    SELECT e AS state, x AS lease INTO r
      FROM fence.epoch_state e LEFT JOIN fence.lease x ON x.resource = resource;
    l := r.lease;
    IF NOT force AND fence._live(l, pg_catalog.clock_timestamp()) AND (NOT waiting OR l.waiters) THEN
        RETURN NULL;
    END IF;
    epoch := fence._state_epoch(r.state);
    IF epoch IS NULL THEN
        PERFORM fence._system_identifier();
        epoch := fence._epoch();
    END IF;
    IF kind = 'session' THEN
        spid := pg_catalog.pg_backend_pid();
    END IF;
    durable := fence._force_durable();

    k := fence._lock_lease(resource, fence._grant_wait());
    IF NOT k.locked THEN
        RETURN NULL;
    END IF;
    l := k.lease;
    now := pg_catalog.clock_timestamp();
    IF l.resource IS NOT NULL AND NOT force AND fence._live(l, now) THEN
        IF waiting AND NOT l.waiters THEN
            UPDATE fence.lease x SET waiters = true WHERE x.resource = resource;
        END IF;
        RETURN NULL;
    END IF;

    t := fence._next_token(epoch, coalesce(l.token, 0));
    IF kind = 'session' THEN
        -- The session-level advisory lock of (resource, token) is the
        -- lease's life (docs/design.md, "Session leases"); skip a token
        -- whose key is taken.
        WHILE NOT pg_catalog.pg_try_advisory_lock(fence._lease_key(resource, t)) LOOP
            t := fence._next_token(t >> 43, t);
        END LOOP;
    END IF;
    IF l.resource IS NULL THEN
        -- ON CONFLICT: a caller under REPEATABLE READ may not see a row that
        -- a racing first grant committed after its snapshot; it is then busy.
        l.token := t;
        INSERT INTO fence.lease AS x (resource, token, holder, kind, acquired_at, expires_at, ended_at, session_pid, waiters)
        VALUES (resource, t, holder, kind, now, now + ttl, CASE WHEN kind = 'revoked' THEN now END, spid, false)
        ON CONFLICT DO NOTHING
        RETURNING x.token INTO t;
        IF t IS NULL AND kind = 'session' THEN
            PERFORM pg_catalog.pg_advisory_unlock(fence._lease_key(resource, l.token));
        END IF;
    ELSE
        UPDATE fence.lease x
           SET token = t, holder = holder, kind = kind, acquired_at = now, expires_at = now + ttl,
               ended_at = CASE WHEN kind = 'revoked' THEN now END,
               session_pid = spid, waiters = false
         WHERE x.resource = resource;
    END IF;
    RETURN t;
END
$$;

-- ---------------------------------------------------------------------------
-- The other two places that forced the flush
-- ---------------------------------------------------------------------------

-- As in 002, with the flush forced by fence._force_durable: a renewal lost
-- in a crash would let the server grant the lease earlier than the holder
-- was told.
CREATE OR REPLACE FUNCTION fence.renew(resource text, token bigint, ttl interval) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    now  timestamptz := pg_catalog.clock_timestamp();
    secs double precision := pg_catalog.date_part('epoch', ttl);
    e    timestamptz;
    durable text;
BEGIN
    IF (fence._name_ok(resource) AND token > 0 AND fence._ttl_ok(secs)) IS NOT TRUE THEN
        PERFORM fence._check_name('resource', resource);
        PERFORM fence._check_token(token);
        PERFORM fence._check_ttl(ttl);
    END IF;
    durable := fence._force_durable();
    UPDATE fence.lease x SET expires_at = now + pg_catalog.make_interval(secs => secs)
     WHERE x.resource = resource AND x.token = token AND x.kind = 'ttl'
       AND x.ended_at IS NULL AND x.expires_at > now
    RETURNING x.expires_at INTO e;
    IF e IS NULL AND EXISTS (SELECT 1 FROM fence.lease x
                              WHERE x.resource = resource AND x.token = token AND x.kind = 'session'
                                AND x.ended_at IS NULL) THEN
        RAISE EXCEPTION 'pgfence: lease % of % is a session lease and has no TTL to renew', token, resource
            USING ERRCODE = '22023', HINT = 'a session lease lives until fence.release or the end of its session; do not renew it';
    END IF;
    RETURN e;
END
$$;

-- The commit-time check of every grant and renewal (constraint triggers
-- lease_durable and lease_durable_update), now through fence._force_durable.
-- SECURITY DEFINER because a deferred trigger runs as whoever commits, and
-- an application role may not call the kit's internal helpers; the function
-- has no argument and only sets synchronous_commit, so running it as the
-- kit's owner gives a caller nothing.
CREATE OR REPLACE FUNCTION fence._durable() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    durable text;
BEGIN
    durable := fence._force_durable();
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION fence.version() RETURNS integer
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT 5 $$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA fence FROM PUBLIC;
