-- pgfence 002 down: back to the functions, constraints and trigger of 001.
-- The function bodies below are those of 001_init.up.sql, unchanged (read
-- the comments there).

ALTER TABLE fence.lease
    ADD CONSTRAINT lease_token_check CHECK (token > 0),
    ADD CONSTRAINT lease_kind_check CHECK (kind IN ('ttl', 'session', 'revoked')),
    ADD CONSTRAINT lease_check CHECK (kind <> 'ttl' OR expires_at IS NOT NULL),
    ADD CONSTRAINT lease_check1 CHECK (kind <> 'session' OR session_pid IS NOT NULL),
    ADD CONSTRAINT lease_check2 CHECK (kind <> 'revoked' OR (holder IS NULL AND ended_at IS NOT NULL));

DROP TRIGGER lease_durable_update ON fence.lease;
CREATE CONSTRAINT TRIGGER lease_durable_update AFTER UPDATE ON fence.lease
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (OLD.token IS DISTINCT FROM NEW.token OR OLD.expires_at IS DISTINCT FROM NEW.expires_at)
    EXECUTE FUNCTION fence._durable();

CREATE OR REPLACE FUNCTION fence._live(l fence.lease, now timestamptz) RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF l.ended_at IS NOT NULL THEN
        RETURN false;
    ELSIF l.kind = 'ttl' THEN
        RETURN l.expires_at > now;
    ELSIF l.kind = 'session' THEN
        RETURN fence._session_alive(l);
    END IF;
    RETURN false;
END
$$;

CREATE OR REPLACE FUNCTION fence._grant(resource text, holder text, kind text, ttl interval, force boolean, waiting boolean) RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_variable
DECLARE
    epoch  bigint;
    first_tok bigint;
    prev_timeout text := pg_catalog.current_setting('lock_timeout');
    wait_setting text := coalesce(nullif(pg_catalog.current_setting('fence.grant_wait', true), ''), '2s');
    wait_ms      bigint;
    spid   integer;
    now    timestamptz;
    l      fence.lease;
    t      bigint;
BEGIN
    IF NOT force THEN
        -- Fast path without a lock: a live lease answers NULL at once, so
        -- waiters that poll never queue behind the holder's writers or
        -- renewals, and pay for nothing else.
        SELECT * INTO l FROM fence.lease x WHERE x.resource = resource;
        IF FOUND AND fence._live(l, pg_catalog.clock_timestamp()) THEN
            IF NOT waiting OR l.waiters THEN
                RETURN NULL;
            END IF;
            -- A waiter that still has to ask for the NOTIFY goes on to the
            -- locks below, which set the flag (or grant, if the lease ended
            -- meanwhile). Not here: an UPDATE here would lock the row before
            -- the gate, the reverse of a grant's order, and deadlock with it.
        END IF;
    END IF;
    epoch := fence._epoch();
    first_tok := (epoch << 43) | 1;
    BEGIN
        wait_ms := pg_catalog.ceil(pg_catalog.date_part('epoch', wait_setting::interval) * 1000)::bigint;
    EXCEPTION WHEN data_exception THEN  -- not an interval, or out of range ('infinity')
        wait_ms := NULL;
    END;
    IF wait_ms IS NULL OR wait_ms <= 0 OR wait_ms > 3600000 THEN
        RAISE EXCEPTION 'pgfence: fence.grant_wait = % is not a wait between 1 millisecond and 1 hour', wait_setting
            USING ERRCODE = '22023', HINT = 'SET fence.grant_wait = ''2s'' (an interval), or RESET fence.grant_wait';
    END IF;
    IF kind = 'session' THEN
        spid := pg_catalog.pg_backend_pid();
    END IF;
    IF pg_catalog.current_setting('synchronous_commit') = 'off' THEN
        PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    END IF;

    PERFORM pg_catalog.set_config('lock_timeout', wait_ms::text, true);
    BEGIN
        PERFORM pg_catalog.pg_advisory_xact_lock(fence._gate_key(resource));
        SELECT * INTO l FROM fence.lease x WHERE x.resource = resource FOR UPDATE;
    EXCEPTION WHEN lock_not_available THEN
        PERFORM pg_catalog.set_config('lock_timeout', prev_timeout, true);
        RETURN NULL;
    END;
    PERFORM pg_catalog.set_config('lock_timeout', prev_timeout, true);
    -- The clock is read once per grant, after any wait: it decides liveness
    -- and gives acquired_at and expires_at.
    now := pg_catalog.clock_timestamp();

    IF l.resource IS NOT NULL THEN
        IF NOT force AND fence._live(l, now) THEN
            IF waiting AND NOT l.waiters THEN
                -- Ask this lease's release for the NOTIFY (a HOT update, by
                -- the first waiter of each lease term).
                UPDATE fence.lease x SET waiters = true WHERE x.resource = resource;
            END IF;
            RETURN NULL;
        END IF;
        t := greatest(l.token + 1, first_tok);
    ELSE
        t := first_tok;  -- first grant of this resource; the gate keeps racing first grants out
    END IF;
    IF kind = 'session' THEN
        -- The session-level advisory lock of (resource, token) is the
        -- lease's life: it ends when the session ends, however that happens.
        -- A key can only be held already if a rolled-back grant computed the
        -- same token; skip such tokens (tokens need to increase, not to be
        -- consecutive).
        WHILE NOT pg_catalog.pg_try_advisory_lock(fence._lease_key(resource, t)) LOOP
            t := t + 1;
        END LOOP;
    END IF;
    IF (t & 8796093022207) = 0 OR (l.resource IS NOT NULL AND t >> 43 > greatest(l.token >> 43, epoch)) THEN
        RAISE EXCEPTION 'pgfence: the tokens of resource % are exhausted in epoch %', resource, t >> 43
            USING ERRCODE = '54000', HINT = 'promote or restore moves to a new epoch; see docs/design.md';
    END IF;
    IF l.resource IS NULL THEN
        -- ON CONFLICT: a caller under REPEATABLE READ may not see a row that
        -- a racing first grant committed after its snapshot; it is then busy.
        l.token := t;  -- the token whose key a session grant holds
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

CREATE OR REPLACE FUNCTION fence.acquire(resource text, holder text, ttl interval, waiting boolean DEFAULT false) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
BEGIN
    PERFORM fence._check_name('resource', resource);
    PERFORM fence._check_name('holder', holder);
    RETURN fence._grant(resource, holder, 'ttl', fence._check_ttl(ttl), false, coalesce(waiting, false));
END
$$;

CREATE OR REPLACE FUNCTION fence.renew(resource text, token bigint, ttl interval) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    now timestamptz := pg_catalog.clock_timestamp();
    e   timestamptz;
BEGIN
    PERFORM fence._check_name('resource', resource);
    PERFORM fence._check_token(token);
    ttl := fence._check_ttl(ttl);
    -- A renewal lost in a crash would let the server grant the lease earlier
    -- than the holder was told; keep it durable like a grant.
    IF pg_catalog.current_setting('synchronous_commit') = 'off' THEN
        PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    END IF;
    UPDATE fence.lease x SET expires_at = now + ttl
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

CREATE OR REPLACE FUNCTION fence.release(resource text, token bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    now  timestamptz := pg_catalog.clock_timestamp();
    l    fence.lease;
BEGIN
    PERFORM fence._check_name('resource', resource);
    PERFORM fence._check_token(token);
    UPDATE fence.lease x SET ended_at = now
     WHERE x.resource = resource AND x.token = token AND fence._live(x, now)
    RETURNING x.* INTO l;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF l.kind = 'session' AND l.session_pid = pg_catalog.pg_backend_pid() THEN
        PERFORM pg_catalog.pg_advisory_unlock(fence._lease_key(resource, token));
    END IF;
    IF l.waiters THEN
        PERFORM fence._notify_free(resource);
    END IF;
    RETURN true;
END
$$;

CREATE OR REPLACE FUNCTION fence.check(resource text, token bigint) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    latest bigint;
BEGIN
    PERFORM fence._check_name('resource', resource);
    IF token IS NULL THEN
        RAISE EXCEPTION 'pgfence: no fencing token presented for resource %', resource
            USING ERRCODE = 'FN002', DETAIL = format('resource=%s token=NULL', resource),
                  HINT = 'pass the token that fence.acquire returned';
    END IF;
    IF token <= 0 THEN
        RAISE EXCEPTION 'pgfence: unknown fencing token % for resource %: tokens are positive', token, resource
            USING ERRCODE = 'FN003', DETAIL = format('resource=%s token=%s', resource, token),
                  HINT = 'pass the token that fence.acquire returned for this resource';
    END IF;
    PERFORM pg_catalog.pg_advisory_xact_lock_shared(fence._gate_key(resource));
    IF pg_catalog.current_setting('transaction_isolation') = 'read committed' THEN
        -- Held gate + a snapshot taken after it: a grant that committed
        -- before we got the gate is seen, and no grant can commit until we
        -- end. No row lock needed (it would cost a WAL record and, with
        -- concurrent writers, a MultiXact per guarded transaction).
        SELECT x.token INTO latest FROM fence.lease x WHERE x.resource = resource;
    ELSE
        -- REPEATABLE READ / SERIALIZABLE: our snapshot may predate a grant
        -- that committed before we got the gate; locking the row then fails
        -- with a serialization error instead of reading the old token.
        SELECT x.token INTO latest FROM fence.lease x WHERE x.resource = resource FOR KEY SHARE;
    END IF;
    IF latest IS NULL THEN
        RAISE EXCEPTION 'pgfence: unknown fencing token % for resource %: it has never been granted', token, resource
            USING ERRCODE = 'FN003', DETAIL = format('resource=%s token=%s latest=none', resource, token),
                  HINT = 'acquire a lease on this resource first and use the token it returns';
    ELSIF token < latest THEN
        RAISE EXCEPTION 'pgfence: stale fencing token % for resource %: a newer lease (token %) was granted', token, resource, latest
            USING ERRCODE = 'FN001', DETAIL = format('resource=%s token=%s latest=%s', resource, token, latest),
                  HINT = 'this holder lost the lease: stop writing, acquire the lease again and redo the work under the new token';
    ELSIF token > latest THEN
        RAISE EXCEPTION 'pgfence: unknown fencing token % for resource %: it was never granted', token, resource
            USING ERRCODE = 'FN003', DETAIL = format('resource=%s token=%s latest=%s', resource, token, latest),
                  HINT = 'use the token that fence.acquire returned for this resource';
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION fence._registered_token(res text, op text, tbl text) RETURNS bigint
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    tok bigint := (nullif(pg_catalog.current_setting('fence.tokens', true), '')::jsonb ->> res)::bigint;
BEGIN
    IF tok IS NULL THEN
        RAISE EXCEPTION 'pgfence: no fencing token for % on protected table %', op, tbl
            USING ERRCODE = 'FN002', DETAIL = format('resource=%s token=NULL', res),
                  HINT = format('call fence.use_token(%L, token) earlier in this transaction', res);
    END IF;
    RETURN tok;
END
$$;

CREATE OR REPLACE FUNCTION fence._guard_row() RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    res text := TG_ARGV[0];
    col text := TG_ARGV[1];
    tok bigint;
    old_tok bigint;
BEGIN
    IF col IS NOT NULL AND TG_OP <> 'DELETE' THEN
        tok := (pg_catalog.to_jsonb(NEW) ->> col)::bigint;
        IF tok IS NULL THEN
            RAISE EXCEPTION 'pgfence: no fencing token in column % of protected table %.%', col, TG_TABLE_SCHEMA, TG_TABLE_NAME
                USING ERRCODE = 'FN002', DETAIL = format('resource=%s token=NULL', res),
                      HINT = format('set %I to the token that fence.acquire(%L, ...) returned', col, res);
        END IF;
        IF TG_OP = 'UPDATE' THEN
            old_tok := (pg_catalog.to_jsonb(OLD) ->> col)::bigint;
            IF old_tok > tok THEN
                RAISE EXCEPTION 'pgfence: stale fencing token % for resource %: the row already carries token %', tok, res, old_tok
                    USING ERRCODE = 'FN001', DETAIL = format('resource=%s token=%s row_token=%s', res, tok, old_tok),
                          HINT = 'an update may never lower the token column; acquire the lease again and use the new token';
            END IF;
        END IF;
    ELSE
        tok := fence._registered_token(res, TG_OP, format('%I.%I', TG_TABLE_SCHEMA, TG_TABLE_NAME));
    END IF;
    PERFORM fence.check(res, tok);
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION fence.version() RETURNS integer
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT 1 $$;

DROP FUNCTION fence._system_identifier(), fence._name_ok(text), fence._ttl_ok(double precision);
