-- Back to pgfence 004: 003's fence._grant and fence._durable and 002's
-- fence.renew, each with its own copy of the synchronous_commit forcing,
-- without the helpers; the CHECK constraint on fence.epoch_state gets back
-- the name PostgreSQL gave it in 001.

CREATE OR REPLACE FUNCTION fence._grant(resource text, holder text, kind text, ttl interval, force boolean, waiting boolean) RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_variable
DECLARE
    r      record;
    l      fence.lease;
    locked boolean := false;
    epoch  bigint;
    prev_timeout text;
    wait_setting text;
    wait_ms bigint;
    spid   integer;
    now    timestamptz;
    t      bigint;
BEGIN
    SELECT e.system_identifier, e.relid, e.timeline, e.base, x AS lease INTO r
      FROM fence.epoch_state e LEFT JOIN fence.lease x ON x.resource = resource;
    l := r.lease;
    IF NOT force AND fence._live(l, pg_catalog.clock_timestamp()) AND (NOT waiting OR l.waiters) THEN
        RETURN NULL;
    END IF;
    IF r.system_identifier::text = pg_catalog.current_setting('fence._system_identifier', true)
       AND r.relid = 'fence.epoch_state'::pg_catalog.regclass::oid AND r.timeline = fence._timeline()
       AND r.base + r.timeline < (1::bigint << 20) THEN
        epoch := r.base + r.timeline;
    ELSE
        PERFORM fence._system_identifier();
        epoch := fence._epoch();
    END IF;
    IF kind = 'session' THEN
        spid := pg_catalog.pg_backend_pid();
    END IF;
    IF pg_catalog.current_setting('synchronous_commit') = 'off' THEN
        PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    END IF;

    wait_setting := nullif(pg_catalog.current_setting('fence.grant_wait', true), '');
    IF wait_setting IS NOT NULL THEN
        BEGIN
            wait_ms := pg_catalog.ceil(pg_catalog.date_part('epoch', wait_setting::interval) * 1000)::bigint;
        EXCEPTION WHEN data_exception THEN
            wait_ms := NULL;
        END;
        IF wait_ms IS NULL OR wait_ms <= 0 OR wait_ms > 3600000 THEN
            RAISE EXCEPTION 'pgfence: fence.grant_wait = % is not a wait between 1 millisecond and 1 hour', wait_setting
                USING ERRCODE = '22023', HINT = 'SET fence.grant_wait = ''2s'' (an interval), or RESET fence.grant_wait';
        END IF;
    END IF;

    IF pg_catalog.pg_try_advisory_xact_lock(fence._gate_key(resource)) THEN
        SELECT * INTO l FROM fence.lease x WHERE x.resource = resource FOR UPDATE SKIP LOCKED;
        locked := FOUND OR NOT EXISTS (SELECT 1 FROM fence.lease x WHERE x.resource = resource);
    END IF;
    IF NOT locked THEN
        prev_timeout := pg_catalog.current_setting('lock_timeout');
        PERFORM pg_catalog.set_config('lock_timeout', coalesce(wait_ms, 2000)::text, true);
        BEGIN
            PERFORM pg_catalog.pg_advisory_xact_lock(fence._gate_key(resource));
            SELECT * INTO l FROM fence.lease x WHERE x.resource = resource FOR UPDATE;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_catalog.set_config('lock_timeout', prev_timeout, true);
            RETURN NULL;
        END;
        PERFORM pg_catalog.set_config('lock_timeout', prev_timeout, true);
    END IF;
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
        -- lease's life (see 001); skip a token whose key is taken.
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

CREATE OR REPLACE FUNCTION fence._durable() RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF pg_catalog.current_setting('synchronous_commit') OPERATOR(pg_catalog.=) 'off' THEN
        PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION fence.renew(resource text, token bigint, ttl interval) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    now  timestamptz := pg_catalog.clock_timestamp();
    secs double precision := pg_catalog.date_part('epoch', ttl);
    e    timestamptz;
BEGIN
    IF (fence._name_ok(resource) AND token > 0 AND fence._ttl_ok(secs)) IS NOT TRUE THEN
        PERFORM fence._check_name('resource', resource);
        PERFORM fence._check_token(token);
        PERFORM fence._check_ttl(ttl);
    END IF;
    -- A renewal lost in a crash would let the server grant the lease earlier
    -- than the holder was told; keep it durable like a grant.
    IF pg_catalog.current_setting('synchronous_commit') = 'off' THEN
        PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    END IF;
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

DROP FUNCTION fence._force_durable();
DROP FUNCTION fence._grant_wait();
DROP FUNCTION fence._wait_ms(text);
DROP FUNCTION fence._lock_lease(text, bigint);
DROP FUNCTION fence._state_epoch(fence.epoch_state);

ALTER TABLE fence.epoch_state RENAME CONSTRAINT epoch_state_one_row TO epoch_state_one_check;

CREATE OR REPLACE FUNCTION fence.version() RETURNS integer
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT 4 $$;
