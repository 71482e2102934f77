-- pgfence 001: schema fence with leases, failover-safe fencing tokens,
-- advisory-lock helpers and stale-token guard triggers.
--
-- Installs only schema "fence" and what lives in it; needs CREATE on the
-- database, no superuser. Every object is schema-qualified, and every entry
-- point (the functions without a leading underscore, and the guard trigger
-- functions) pins its search_path, so that nothing planted in another schema
-- (public, a temporary schema) can be picked up by name resolution. Internal
-- helpers run inside those entry points (see fence._lease_key).
--
-- Reference: docs/sql.md. Design: docs/design.md.

CREATE SCHEMA fence;
COMMENT ON SCHEMA fence IS 'pgfence: leases with fencing tokens and guards that refuse stale tokens (docs/sql.md)';

-- ---------------------------------------------------------------------------
-- Tables
-- ---------------------------------------------------------------------------

-- One row per resource ever granted. The row keeps the latest token of the
-- resource forever (also after release or expiry): the next grant is computed
-- from it, and fence.check compares against it. A grant rewrites the row in
-- the same transaction that computes the token, so a token is durable exactly
-- when its grant committed (there is no sequence whose nextval could be handed
-- out again after a crash).
--
-- Only resource and token are indexed, so fence.renew and fence.release
-- (which change neither) are HOT updates; fillfactor leaves room on the page
-- for them.
CREATE TABLE fence.lease (
    resource      text COLLATE "C" PRIMARY KEY,
    token         bigint NOT NULL CHECK (token > 0),
    holder        text,
    kind          text NOT NULL CHECK (kind IN ('ttl', 'session', 'revoked')),
    acquired_at   timestamptz NOT NULL,
    expires_at    timestamptz,
    ended_at      timestamptz,
    session_pid   integer,
    -- Someone waits for this lease (fence.acquire(..., waiting => true) got
    -- NULL): its release sends a NOTIFY. Releases nobody waits for send none,
    -- because NOTIFY serializes the commits of all notifying transactions of
    -- the cluster (a lock held through the commit's flush).
    waiters       boolean NOT NULL DEFAULT false,
    -- This constraint is what makes fence.check linearizable, not a
    -- nicety: it makes token a key column, so a grant is a key update. A
    -- FOR KEY SHARE lock on a row version whose non-key columns were updated
    -- by a transaction that committed after the locker's snapshot succeeds on
    -- the old version without a re-read, and fence.check would then compare
    -- against the old token (found by the race test in sqlfuncs). A key
    -- update makes the locker wait or re-read the newest version instead.
    CONSTRAINT lease_token_key UNIQUE (resource, token),
    CHECK (kind <> 'ttl' OR expires_at IS NOT NULL),
    CHECK (kind <> 'session' OR session_pid IS NOT NULL),
    CHECK (kind <> 'revoked' OR (holder IS NULL AND ended_at IS NOT NULL))
) WITH (fillfactor = 80);
COMMENT ON TABLE fence.lease IS 'pgfence internal: one row per resource with its latest token; read fence.leases instead';

-- The token epoch (the high bits of every token). See fence._epoch.
CREATE TABLE fence.epoch_state (
    one               boolean PRIMARY KEY DEFAULT true CHECK (one),
    system_identifier bigint NOT NULL,
    relid             oid NOT NULL,  -- the OID of this table: a restored copy has another
    timeline          bigint NOT NULL,
    base              bigint NOT NULL
);
COMMENT ON TABLE fence.epoch_state IS 'pgfence internal: where token epochs stand (system identifier, WAL timeline, base)';

-- ---------------------------------------------------------------------------
-- Internal helpers (prefix _; not granted to application roles)
-- ---------------------------------------------------------------------------

-- The current WAL timeline of this server. It changes on every promotion of a
-- standby, at once (pg_control_checkpoint() would lag until the first
-- checkpoint after promotion). Fails during recovery, where no grant can be
-- made anyway.
CREATE FUNCTION fence._timeline() RETURNS bigint
LANGUAGE sql VOLATILE
AS $$
    SELECT ('x' || lpad(substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8), 16, '0'))::bit(64)::bigint
$$;

-- The epoch that goes into the high bits of every token granted now.
--
-- Token layout (docs/design.md): token = epoch << 43 | counter, with
-- 1 <= counter < 2^43 and 1 <= epoch < 2^20, so every token is a positive
-- bigint. Per resource the counter grows by one per grant within an epoch, so
-- one resource can be granted 8,796,093,022,207 times per epoch (at 100,000
-- grants a second, 2.8 years of nothing but grants of that resource), and the
-- kit survives 1,048,575 epochs.
--
-- epoch = base + current WAL timeline. Promotion of a standby always moves to
-- a timeline higher than any it descends from, so tokens granted after a
-- promotion exceed every token granted before it on the old primary, also the
-- grants the standby never received. A dump and restore, into another
-- cluster (another system identifier; the timeline starts again at 1) or
-- into another database of the same cluster (recognised by the OID of table
-- fence.epoch_state, which a restore creates anew while physical replication
-- and pg_upgrade keep it), moves the base past every epoch known so far: the
-- one recorded here and the highest one found in the restored tokens, so the
-- grants the source made after the dump stay below. The base is a pure
-- function of the stored
-- state, so two servers that diverge from the same state (a primary and its
-- standby) compute the same base and differ by their timelines.
CREATE FUNCTION fence._epoch() RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    sysid bigint := (pg_catalog.pg_control_system()).system_identifier;
    myrel oid := 'fence.epoch_state'::pg_catalog.regclass::oid;
    tli   bigint := fence._timeline();
    s     fence.epoch_state;
    nbase bigint;
BEGIN
    SELECT * INTO s FROM fence.epoch_state;
    IF NOT FOUND OR s.system_identifier <> sysid OR s.relid <> myrel OR s.timeline <> tli THEN
        -- Rare: first grant after a promotion or a restore. Serialize the
        -- update; concurrent grants re-read the row after we commit.
        SELECT * INTO s FROM fence.epoch_state FOR UPDATE;
        IF NOT FOUND THEN
            nbase := coalesce((SELECT max(l.token) >> 43 FROM fence.lease l), 0);
            INSERT INTO fence.epoch_state (system_identifier, relid, timeline, base) VALUES (sysid, myrel, tli, nbase);
        ELSIF s.system_identifier = sysid AND s.relid = myrel AND s.timeline < tli THEN
            nbase := s.base;  -- promotion: the timeline alone moves the epoch up
            UPDATE fence.epoch_state SET timeline = tli;
        ELSIF s.system_identifier <> sysid OR s.relid <> myrel OR s.timeline > tli THEN
            -- a restored copy (another cluster or another database) or a
            -- timeline that went back: move past every epoch this data has seen
            nbase := greatest(s.base + s.timeline,
                              coalesce((SELECT max(l.token) >> 43 FROM fence.lease l), 0));
            UPDATE fence.epoch_state SET system_identifier = sysid, relid = myrel, timeline = tli, base = nbase;
        ELSE
            nbase := s.base;  -- another grant updated it while we waited
        END IF;
    ELSE
        nbase := s.base;
    END IF;
    IF nbase + tli >= (1::bigint << 20) THEN
        RAISE EXCEPTION 'pgfence token epochs are exhausted (epoch %)', nbase + tli
            USING ERRCODE = '54000',
                  HINT = 'the token layout allows 2^20 epochs (promotions and restores); see docs/design.md';
    END IF;
    RETURN nbase + tli;
END
$$;

-- Argument checks shared by every function. Names (resource, holder, lock
-- names) are 1 to 255 characters.
CREATE FUNCTION fence._check_name(what text, v text) RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF v IS NULL THEN
        RAISE EXCEPTION 'pgfence: % must not be NULL', what
            USING ERRCODE = '22004', HINT = format('pass a non-empty %s of at most 255 characters', what);
    ELSIF v = '' THEN
        RAISE EXCEPTION 'pgfence: % must not be empty', what
            USING ERRCODE = '22023', HINT = format('pass a non-empty %s of at most 255 characters', what);
    ELSIF pg_catalog.char_length(v) > 255 THEN
        RAISE EXCEPTION 'pgfence: % is % characters long; the limit is 255', what, pg_catalog.char_length(v)
            USING ERRCODE = '22001', HINT = format('use a shorter %s (a hash of a long name works)', what);
    END IF;
END
$$;

-- TTLs go from 10 milliseconds to 1 day. A longer hold is a shorter TTL that
-- is renewed: a lease that outlives a crashed holder by days is a mistake.
-- Returns the TTL as plain seconds: the range is checked on the same number
-- that is added to the clock, so no mix of months, days and seconds can slip
-- past it, and daylight-saving changes cannot stretch a day.
CREATE FUNCTION fence._check_ttl(ttl interval) RETURNS interval
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    secs double precision := pg_catalog.date_part('epoch', ttl);
BEGIN
    IF ttl IS NULL THEN
        RAISE EXCEPTION 'pgfence: ttl must not be NULL'
            USING ERRCODE = '22004', HINT = 'pass a ttl between 10 milliseconds and 1 day, for example interval ''30 seconds''';
    ELSIF secs < 0.01 OR secs > 86400 THEN
        RAISE EXCEPTION 'pgfence: ttl % is out of range', ttl
            USING ERRCODE = '22023', HINT = 'pass a ttl between 10 milliseconds and 1 day; renew the lease to hold it longer';
    END IF;
    RETURN pg_catalog.make_interval(secs => secs);
END
$$;

CREATE FUNCTION fence._check_token(token bigint) RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF token IS NULL THEN
        RAISE EXCEPTION 'pgfence: token must not be NULL'
            USING ERRCODE = '22004', HINT = 'pass the token that fence.acquire returned';
    ELSIF token <= 0 THEN
        RAISE EXCEPTION 'pgfence: token % is not positive; tokens are positive', token
            USING ERRCODE = '22023', HINT = 'pass the token that fence.acquire returned';
    END IF;
END
$$;

-- The advisory-lock key of one session lease: hashtextextended(resource,
-- token) moved into [2^62, 2^63). Bound to the token, not only the resource:
-- a lock left behind (by a rolled-back acquire_session, or by a holder whose
-- lease was revoked) belongs to a token that is no longer the latest and
-- blocks nothing. (The key only has to agree within one running server, so
-- PostgreSQL's own fast hash is fine here; fence.lock_key, which programs
-- compute on their side, uses sha256.)
--
-- Internal helpers like this one carry no SET search_path: they are called
-- from functions that pin it, and every name in them is schema-qualified
-- (operators too), so they can be inlined and cost no setting changes.
CREATE FUNCTION fence._lease_key(resource text, token bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT (pg_catalog.hashtextextended(resource, token) OPERATOR(pg_catalog.&) 4611686018427387903)
           OPERATOR(pg_catalog.|) 4611686018427387904
$$;

-- The key of a resource's gate, in [2^61, 2^62): fence.check takes it shared
-- and a grant exclusive, both at transaction level (see fence._grant).
-- Key ranges: golang-migrate [0, 2^32), gates [2^61, 2^62), session leases
-- [2^62, 2^63), fence.lock_key negative: they never collide.
CREATE FUNCTION fence._gate_key(resource text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT (pg_catalog.hashtextextended(resource, 0) OPERATOR(pg_catalog.&) 2305843009213693951)
           OPERATOR(pg_catalog.|) 2305843009213693952
$$;

-- Whether this session holds the advisory lock of key k (pg_locks is readable
-- by every role, unlike other roles' rows of pg_stat_activity).
CREATE FUNCTION fence._holds_lease_key(k bigint) RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    SELECT EXISTS (
        SELECT 1 FROM pg_catalog.pg_locks x
         WHERE x.locktype = 'advisory' AND x.granted AND x.pid = pg_catalog.pg_backend_pid()
           AND x.objsubid = 1 AND x.classid::bigint = k >> 32 AND x.objid::bigint = k & 4294967295)
$$;

-- Whether the session that took a session lease still holds it. In our own
-- session (same pid) an advisory lock request would succeed re-entrantly and
-- prove nothing, so we look for the lock in pg_locks (a new backend that
-- reuses a dead holder's pid does not hold it). For another session, taking
-- the lease's key at transaction level succeeds exactly when no session holds
-- it any more.
CREATE FUNCTION fence._session_alive(l fence.lease) RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    k bigint := fence._lease_key(l.resource, l.token);
BEGIN
    IF l.session_pid = pg_catalog.pg_backend_pid() THEN
        RETURN fence._holds_lease_key(k);
    END IF;
    RETURN NOT pg_catalog.pg_try_advisory_xact_lock(k);
END
$$;

-- Whether a lease row is live at server time now.
CREATE FUNCTION fence._live(l fence.lease, now timestamptz) RETURNS boolean
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

-- Grants a new token for resource, to holder (NULL with kind 'revoked'),
-- expiring after ttl (NULL for session leases and revocations).
-- Returns NULL when a live lease exists (unless force) or when the resource
-- stays busy past the grant wait.
--
-- Locking order, and why it gives guarantee 3 (linearizable fencing):
-- every guarded write runs fence.check, which takes the resource's gate (an
-- advisory lock) in share mode, holds it until the writing transaction ends,
-- and then reads the lease row (with a FOR KEY SHARE lock under REPEATABLE
-- READ and SERIALIZABLE, see fence.check). A grant takes the gate
-- in exclusive mode and then locks the row FOR UPDATE before it computes the
-- new token. So either
--   (a) the writer locked first: the grant waits until the writing
--       transaction has committed or rolled back, so every write made under
--       the old token is ordered before the new token exists; or
--   (b) the grant locked first: the writer waits for the granting
--       transaction; under READ COMMITTED it then reads the newest row,
--       finds the newer token and fails with FN001; under REPEATABLE READ or
--       SERIALIZABLE its row lock fails with a serialization error (the row
--       changed after its snapshot).
-- Either way no write under the old token commits after the grant.
--
-- Why a gate as well as the row lock: row locks are not queued fairly. A
-- FOR KEY SHARE request never waits behind a waiting FOR UPDATE; it joins
-- the current lockers, so a stream of overlapping writers could hold a grant
-- off forever. The heavyweight lock manager queues a new share request
-- behind a waiting exclusive one, so with the gate the grant waits only for
-- the writers that were already in, and the wait has a bound. The row lock
-- stays for (b) under REPEATABLE READ, and the unique (resource, token)
-- constraint for the reason given at table fence.lease. The grant never
-- touches protected tables, and both lock in the same order (gate, row), so
-- writers and grants cannot deadlock with each other. Renew and release take
-- neither the gate nor a conflicting row lock (FOR NO KEY UPDATE does not
-- conflict with FOR KEY SHARE): writers never delay the holder's renewals.
--
-- The wait is bounded by fence.grant_wait (an interval, default 2s; a
-- lock_timeout applied to these two locks only): a paused holder with an
-- open transaction makes the grant report busy, it never hangs.
--
-- Durability: the token is written to the row in the granting transaction,
-- and synchronous_commit is forced back on for that transaction if the
-- caller turned it off (here, and again at commit by the deferred trigger
-- lease_durable), so a grant that returned survives a crash.
CREATE FUNCTION fence._grant(resource text, holder text, kind text, ttl interval, force boolean, waiting boolean) RETURNS bigint
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

-- Deferred to commit, so that nothing the caller does later in the
-- transaction (SET LOCAL synchronous_commit = off) can make a grant or a
-- renewal asynchronous: a crash must never lose a token that was handed out.
CREATE FUNCTION fence._durable() RETURNS trigger
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF pg_catalog.current_setting('synchronous_commit') = 'off' THEN
        PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    END IF;
    RETURN NULL;
END
$$;
CREATE CONSTRAINT TRIGGER lease_durable AFTER INSERT ON fence.lease
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION fence._durable();
-- Only grants and renewals need it (a lost release or waiter flag is safe).
CREATE CONSTRAINT TRIGGER lease_durable_update AFTER UPDATE ON fence.lease
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (OLD.token IS DISTINCT FROM NEW.token OR OLD.expires_at IS DISTINCT FROM NEW.expires_at)
    EXECUTE FUNCTION fence._durable();

CREATE FUNCTION fence._notify_free(resource text) RETURNS void
LANGUAGE sql VOLATILE
AS $$ SELECT pg_catalog.pg_notify('fence_release', resource) $$;

-- ---------------------------------------------------------------------------
-- Leases
-- ---------------------------------------------------------------------------

-- waiting: the caller will wait for the lease if it gets NULL (gofence's
-- Lock does): the holder's release then sends a NOTIFY on fence_release.
CREATE FUNCTION fence.acquire(resource text, holder text, ttl interval, waiting boolean DEFAULT false) RETURNS bigint
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
COMMENT ON FUNCTION fence.acquire(text, text, interval, boolean) IS
    'a new fencing token when no live lease exists for resource, else NULL (with waiting => true, the release of the live lease will NOTIFY fence_release)';

CREATE FUNCTION fence.acquire_session(resource text, holder text) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
BEGIN
    PERFORM fence._check_name('resource', resource);
    PERFORM fence._check_name('holder', holder);
    RETURN fence._grant(resource, holder, 'session', NULL, false, false);
END
$$;
COMMENT ON FUNCTION fence.acquire_session(text, text) IS
    'a new fencing token bound to this session (no TTL; ends on release or when the session ends), else NULL';

CREATE FUNCTION fence.renew(resource text, token bigint, ttl interval) RETURNS timestamptz
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
COMMENT ON FUNCTION fence.renew(text, bigint, interval) IS
    'new expiry (server clock) when token is the live lease of resource, else NULL';

CREATE FUNCTION fence.release(resource text, token bigint) RETURNS boolean
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
COMMENT ON FUNCTION fence.release(text, bigint) IS
    'ends the live lease held with token (true); false when token is not the live lease; idempotent';

CREATE FUNCTION fence.revoke(resource text) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    t bigint;
BEGIN
    PERFORM fence._check_name('resource', resource);
    t := fence._grant(resource, NULL, 'revoked', NULL, true, false);
    IF t IS NULL THEN
        RAISE EXCEPTION 'pgfence: resource % is busy: a transaction that wrote under its current token is still open', resource
            USING ERRCODE = 'FN004',
                  HINT = 'retry, raise fence.grant_wait, or end that transaction (see pg_stat_activity and pg_locks on fence.lease)';
    END IF;
    PERFORM fence._notify_free(resource);
    RETURN t;
END
$$;
COMMENT ON FUNCTION fence.revoke(text) IS
    'operator action: ends any lease of resource and grants a new token to nobody, so every outstanding token is stale';

-- ---------------------------------------------------------------------------
-- Guards
-- ---------------------------------------------------------------------------

-- Raises unless token is the latest grant of resource, and holds the
-- resource's gate in share mode until the calling transaction ends, so that
-- no new grant can happen before it commits (see fence._grant for why that
-- ordering is linearizable).
CREATE FUNCTION fence.check(resource text, token bigint) RETURNS void
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
COMMENT ON FUNCTION fence.check(text, bigint) IS
    'raises FN001 (stale), FN002 (no token) or FN003 (never granted) unless token is the latest grant; holds the resource''s gate so a new grant waits for this transaction';

-- check, then remember the token in the transaction-local setting
-- fence.tokens (a JSON object resource -> token) for guarded tables without a
-- token column. The setting is only a hint of which token to check: every
-- guarded statement still runs fence.check, so writing the setting by hand
-- gains nothing.
CREATE FUNCTION fence.use_token(resource text, token bigint) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    m jsonb;
BEGIN
    PERFORM fence.check(resource, token);
    m := coalesce(nullif(pg_catalog.current_setting('fence.tokens', true), '')::jsonb, '{}'::jsonb);
    PERFORM pg_catalog.set_config('fence.tokens',
        pg_catalog.jsonb_set(m, ARRAY[resource], pg_catalog.to_jsonb(token))::text, true);
END
$$;
COMMENT ON FUNCTION fence.use_token(text, bigint) IS
    'fence.check, then remembers the token for the rest of the transaction for guarded tables without a token column';

-- The token that fence.use_token registered for res in this transaction, or
-- FN002 naming the statement and table that needed it.
CREATE FUNCTION fence._registered_token(res text, op text, tbl text) RETURNS bigint
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

-- Row guard (AFTER INSERT OR UPDATE OR DELETE, FOR EACH ROW). TG_ARGV:
-- resource, and the token column when the table has one. INSERT and UPDATE
-- of a table with a token column take the token from the row; everything
-- else (tables without one, and DELETE) takes it from fence.use_token.
--
-- Row-level, even without a token column, because row triggers fire on the
-- table that holds the row: a write routed through a partitioned parent (or
-- an inheritance parent) that the table was attached to after fence.protect
-- still meets the guard, where a statement trigger would not fire. AFTER, so
-- it checks the row as written, whatever BEFORE triggers did to it; an error
-- still undoes the statement, and the locks fence.check takes last until the
-- transaction ends, which is all the ordering argument needs.
--
-- The guards run with the rights of the role that writes (SECURITY INVOKER):
-- they read the row with to_jsonb, which can call user-defined casts, and
-- such code must never run with the kit owner's rights. The only privileged
-- step is fence.check. A role without fence.grant_usage therefore cannot
-- write to a protected table at all (42501): the guard fails closed.
CREATE FUNCTION fence._guard_row() RETURNS trigger
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

-- TRUNCATE guard (BEFORE TRUNCATE, FOR EACH STATEMENT): a TRUNCATE has no
-- rows, so the token comes from fence.use_token. TG_ARGV: resource.
CREATE FUNCTION fence._guard_stmt() RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM fence.check(TG_ARGV[0], fence._registered_token(TG_ARGV[0], TG_OP, format('%I.%I', TG_TABLE_SCHEMA, TG_TABLE_NAME)));
    RETURN NULL;
END
$$;

-- Splits trigger arguments (pg_trigger.tgargs: NUL-terminated strings).
CREATE FUNCTION fence._trigger_arg(args bytea, n integer) RETURNS text
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp  -- it runs from the view fence.protected, under the caller's search_path
AS $$
DECLARE
    i integer := 0;
    p integer;
BEGIN
    LOOP
        p := pg_catalog.position(args, '\x00'::bytea);
        IF p = 0 THEN
            RETURN NULL;
        END IF;
        IF i = n THEN
            RETURN pg_catalog.convert_from(pg_catalog.substr(args, 1, p - 1), pg_catalog.getdatabaseencoding());
        END IF;
        args := pg_catalog.substr(args, p + 1);
        i := i + 1;
    END LOOP;
END
$$;

-- Installs the guard triggers on tbl. Runs with the caller's rights: only the
-- table's owner (or a member of the owning role) may protect it, exactly as
-- for CREATE TRIGGER. Every identifier is quoted by format('%I') and every
-- argument by format('%L').
CREATE FUNCTION fence.protect(tbl regclass, resource text, token_column name DEFAULT NULL) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    c   record;
    tg  record;
    typ oid;
    qn  text;
BEGIN
    IF tbl IS NULL THEN
        RAISE EXCEPTION 'pgfence: table must not be NULL' USING ERRCODE = '22004', HINT = 'pass a table name, for example ''public.orders''';
    END IF;
    PERFORM fence._check_name('resource', resource);
    SELECT r.relkind, r.relowner, n.nspname, r.relname INTO c
      FROM pg_catalog.pg_class r JOIN pg_catalog.pg_namespace n ON n.oid = r.relnamespace
     WHERE r.oid = tbl;
    IF c.relkind IS NULL THEN
        RAISE EXCEPTION 'pgfence: there is no table with OID %', tbl::oid
            USING ERRCODE = '42P01', HINT = 'pass the name of an existing table';
    END IF;
    IF c.nspname = 'fence' THEN
        RAISE EXCEPTION 'pgfence: % belongs to the kit itself and cannot be protected', tbl
            USING ERRCODE = '42809', HINT = 'protect your application''s tables';
    END IF;
    IF c.relkind <> 'r' THEN
        RAISE EXCEPTION 'pgfence: % is not an ordinary table', tbl
            USING ERRCODE = '42809', HINT = 'protect a plain table; partitioned tables and views cannot be protected';
    END IF;
    -- The rows of an inheritance child (or of a partition) live in the child:
    -- a guard on the parent does not see them, and a TRUNCATE of a parent
    -- does not fire a child's statement trigger. Keep the meaning of
    -- "protected" simple: refuse both sides of an existing tree. (A table
    -- attached later stays guarded: its row triggers fire for rows routed to
    -- it.)
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_inherits i WHERE i.inhrelid = tbl OR i.inhparent = tbl) THEN
        RAISE EXCEPTION 'pgfence: % is part of an inheritance or partition tree', tbl
            USING ERRCODE = '42809', HINT = 'protect a plain table with no parent and no children (it may be attached as a partition afterwards)';
    END IF;
    IF NOT pg_catalog.pg_has_role(current_user, c.relowner, 'USAGE') THEN
        RAISE EXCEPTION 'pgfence: only the owner of table % can protect it', tbl
            USING ERRCODE = '42501', HINT = 'run fence.protect as the role that owns the table';
    END IF;
    qn := format('%I.%I', c.nspname, c.relname);
    IF token_column IS NOT NULL THEN
        SELECT a.atttypid INTO typ FROM pg_catalog.pg_attribute a
         WHERE a.attrelid = tbl AND a.attname = token_column AND a.attnum > 0 AND NOT a.attisdropped;
        IF typ IS NULL THEN
            RAISE EXCEPTION 'pgfence: column % of table % does not exist', token_column, tbl
                USING ERRCODE = '42703', HINT = 'pass the name of the table''s bigint token column, or NULL to use fence.use_token';
        END IF;
        -- a domain over bigint is fine
        WHILE (SELECT t.typtype FROM pg_catalog.pg_type t WHERE t.oid = typ) = 'd' LOOP
            typ := (SELECT t.typbasetype FROM pg_catalog.pg_type t WHERE t.oid = typ);
        END LOOP;
        IF typ <> 'pg_catalog.int8'::pg_catalog.regtype::oid THEN
            RAISE EXCEPTION 'pgfence: token column % of table % has type %, not bigint', token_column, tbl, typ::regtype
                USING ERRCODE = '42804', HINT = format('tokens need 63 bits: ALTER TABLE %s ALTER COLUMN %I TYPE bigint', qn, token_column);
        END IF;
    END IF;

    FOR tg IN SELECT t.tgname FROM pg_catalog.pg_trigger t
               WHERE t.tgrelid = tbl AND t.tgname IN ('zz_fence_guard_row', 'zz_fence_guard_stmt') LOOP
        EXECUTE format('DROP TRIGGER %I ON %s', tg.tgname, qn);
    END LOOP;
    IF token_column IS NOT NULL THEN
        EXECUTE format('CREATE TRIGGER zz_fence_guard_row AFTER INSERT OR UPDATE OR DELETE ON %s FOR EACH ROW EXECUTE FUNCTION fence._guard_row(%L, %L)',
                       qn, resource, token_column);
    ELSE
        EXECUTE format('CREATE TRIGGER zz_fence_guard_row AFTER INSERT OR UPDATE OR DELETE ON %s FOR EACH ROW EXECUTE FUNCTION fence._guard_row(%L)',
                       qn, resource);
    END IF;
    EXECUTE format('CREATE TRIGGER zz_fence_guard_stmt BEFORE TRUNCATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION fence._guard_stmt(%L)',
                   qn, resource);
END
$$;
COMMENT ON FUNCTION fence.protect(regclass, text, name) IS
    'installs guard triggers on tbl so writes need the latest token of resource (from token_column, or fence.use_token)';

CREATE FUNCTION fence.unprotect(tbl regclass) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c  record;
    tg record;
    qn text;
BEGIN
    IF tbl IS NULL THEN
        RAISE EXCEPTION 'pgfence: table must not be NULL' USING ERRCODE = '22004', HINT = 'pass a table name, for example ''public.orders''';
    END IF;
    SELECT r.relowner, n.nspname, r.relname INTO c
      FROM pg_catalog.pg_class r JOIN pg_catalog.pg_namespace n ON n.oid = r.relnamespace
     WHERE r.oid = tbl;
    IF c.relname IS NULL THEN
        RAISE EXCEPTION 'pgfence: there is no table with OID %', tbl::oid
            USING ERRCODE = '42P01', HINT = 'pass the name of an existing table';
    END IF;
    IF NOT pg_catalog.pg_has_role(current_user, c.relowner, 'USAGE') THEN
        RAISE EXCEPTION 'pgfence: only the owner of table % can unprotect it', tbl
            USING ERRCODE = '42501', HINT = 'run fence.unprotect as the role that owns the table';
    END IF;
    qn := format('%I.%I', c.nspname, c.relname);
    FOR tg IN SELECT t.tgname FROM pg_catalog.pg_trigger t
               WHERE t.tgrelid = tbl AND t.tgname IN ('zz_fence_guard_row', 'zz_fence_guard_stmt') LOOP
        EXECUTE format('DROP TRIGGER %I ON %s', tg.tgname, qn);
    END LOOP;
END
$$;
COMMENT ON FUNCTION fence.unprotect(regclass) IS 'removes the guard triggers that fence.protect installed on tbl';

-- ---------------------------------------------------------------------------
-- Advisory-lock helpers
-- ---------------------------------------------------------------------------

-- The key of a name: the first 8 bytes of sha256(name as UTF-8), read as a
-- big-endian integer, with the top bit set. So every key is negative and never
-- in golang-migrate's [0, 2^32) nor in the session-lease keys [2^62, 2^63).
-- Stable across PostgreSQL versions (unlike hashtext); gofence.LockKey
-- computes the same value.
CREATE FUNCTION fence.lock_key(name text) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM fence._check_name('lock name', name);
    RETURN ('x' || pg_catalog.encode(pg_catalog.substr(pg_catalog.sha256(pg_catalog.convert_to(name, 'UTF8')), 1, 8), 'hex'))::bit(64)::bigint
           | (-9223372036854775807 - 1);
END
$$;
COMMENT ON FUNCTION fence.lock_key(text) IS
    'advisory-lock key of a name: first 8 bytes of sha256(UTF-8 name), big-endian, top bit set (always negative)';

CREATE FUNCTION fence.try_lock(name text) RETURNS boolean
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT pg_catalog.pg_try_advisory_lock(fence.lock_key(name)) $$;
COMMENT ON FUNCTION fence.try_lock(text) IS 'session-level advisory lock on fence.lock_key(name) without waiting';

CREATE FUNCTION fence.unlock(name text) RETURNS boolean
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT pg_catalog.pg_advisory_unlock(fence.lock_key(name)) $$;
COMMENT ON FUNCTION fence.unlock(text) IS 'releases a fence.try_lock; false (with a warning) when this session does not hold it';

CREATE FUNCTION fence.try_xact_lock(name text) RETURNS boolean
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT pg_catalog.pg_try_advisory_xact_lock(fence.lock_key(name)) $$;
COMMENT ON FUNCTION fence.try_xact_lock(text) IS 'transaction-level advisory lock on fence.lock_key(name) without waiting';

-- ---------------------------------------------------------------------------
-- Views
-- ---------------------------------------------------------------------------

CREATE VIEW fence.leases AS
SELECT l.resource,
       l.holder,
       l.token,
       l.kind,
       l.acquired_at,
       l.expires_at,
       l.ended_at,
       CASE
           WHEN l.ended_at IS NOT NULL THEN false
           WHEN l.kind = 'ttl' THEN l.expires_at > pg_catalog.clock_timestamp()
           WHEN l.kind = 'session' THEN EXISTS (
               SELECT 1 FROM pg_catalog.pg_locks k
                WHERE k.locktype = 'advisory' AND k.granted AND k.pid = l.session_pid AND k.objsubid = 1
                  AND k.classid::bigint = fence._lease_key(l.resource, l.token) >> 32
                  AND k.objid::bigint = fence._lease_key(l.resource, l.token) & 4294967295)
           ELSE false
       END AS live,
       l.session_pid
  FROM fence.lease l;
COMMENT ON VIEW fence.leases IS
    'every resource ever granted: holder, latest token, kind (ttl, session, revoked), times, and whether the lease is live now by the server clock';

CREATE VIEW fence.protected AS
SELECT t.tgrelid::regclass AS tbl,
       fence._trigger_arg(t.tgargs, 0) AS resource,
       (max(fence._trigger_arg(t.tgargs, 1)) FILTER (WHERE t.tgname = 'zz_fence_guard_row'))::name AS token_column
  FROM pg_catalog.pg_trigger t
 WHERE t.tgfoid IN ('fence._guard_row()'::regprocedure, 'fence._guard_stmt()'::regprocedure)
 GROUP BY t.tgrelid, fence._trigger_arg(t.tgargs, 0);
COMMENT ON VIEW fence.protected IS 'every table guarded by fence.protect, with its resource and token column (NULL: fence.use_token)';

-- ---------------------------------------------------------------------------
-- Version and privileges
-- ---------------------------------------------------------------------------

-- The migration level of the installed kit; each later migration replaces it.
CREATE FUNCTION fence.version() RETURNS integer
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT 1 $$;
COMMENT ON FUNCTION fence.version() IS 'the migration version of the installed pgfence schema';

-- Grants an application role what it needs to hold leases and write under
-- tokens; with operator, also fence.revoke. Of the internal functions it
-- grants only what runs with the caller's rights: the guard trigger functions
-- (CREATE TRIGGER in fence.protect needs EXECUTE on them; they cannot be
-- called directly) and what they call (fence._registered_token, which reads
-- the setting fence.use_token wrote), fence._check_name (argument checks), fence._lease_key (a
-- hash, used by the fence.leases view) and fence._trigger_arg (used by the
-- fence.protected view), which have no side effects. Run by the kit's owner (the role
-- that applied the migrations) or a superuser.
CREATE FUNCTION fence.grant_usage(role name, operator boolean DEFAULT false) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
BEGIN
    IF role IS NULL THEN
        RAISE EXCEPTION 'pgfence: role must not be NULL' USING ERRCODE = '22004', HINT = 'pass the name of the application role';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = role) THEN
        RAISE EXCEPTION 'pgfence: role % does not exist', role USING ERRCODE = '42704', HINT = 'create the role first (CREATE ROLE)';
    END IF;
    EXECUTE format('GRANT USAGE ON SCHEMA fence TO %I', role);
    EXECUTE format('GRANT SELECT ON fence.leases, fence.protected TO %I', role);
    EXECUTE format('GRANT EXECUTE ON FUNCTION fence.acquire(text, text, interval, boolean), fence.acquire_session(text, text),
        fence.renew(text, bigint, interval), fence.release(text, bigint), fence.check(text, bigint),
        fence.use_token(text, bigint), fence.protect(regclass, text, name), fence.unprotect(regclass),
        fence._guard_row(), fence._guard_stmt(), fence._registered_token(text, text, text), fence._check_name(text, text), fence._lease_key(text, bigint), fence._trigger_arg(bytea, integer),
        fence.lock_key(text), fence.try_lock(text), fence.unlock(text),
        fence.try_xact_lock(text), fence.version() TO %I', role);
    IF operator THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION fence.revoke(text) TO %I', role);
    END IF;
END
$$;
COMMENT ON FUNCTION fence.grant_usage(name, boolean) IS
    'grants role the use of the kit (leases, guards, advisory helpers); with operator => true also fence.revoke';

CREATE FUNCTION fence.revoke_usage(role name) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
BEGIN
    IF role IS NULL THEN
        RAISE EXCEPTION 'pgfence: role must not be NULL' USING ERRCODE = '22004', HINT = 'pass the name of the application role';
    END IF;
    EXECUTE format('REVOKE ALL ON ALL FUNCTIONS IN SCHEMA fence FROM %I', role);
    EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA fence FROM %I', role);
    EXECUTE format('REVOKE ALL ON SCHEMA fence FROM %I', role);
END
$$;
COMMENT ON FUNCTION fence.revoke_usage(name) IS 'takes back everything fence.grant_usage gave role';

-- Nothing in the kit is usable by PUBLIC; fence.grant_usage hands it out.
REVOKE ALL ON SCHEMA fence FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA fence FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA fence FROM PUBLIC;

INSERT INTO fence.epoch_state (system_identifier, relid, timeline, base)
VALUES ((pg_catalog.pg_control_system()).system_identifier, 'fence.epoch_state'::pg_catalog.regclass, fence._timeline(), 0);
