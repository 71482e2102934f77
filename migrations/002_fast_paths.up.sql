-- pgfence 002: faster grants, releases and guards (issue 6). Same SQL surface,
-- same guarantees; what changed and why is said at each object below and in
-- docs/design.md ("Costs").
--
-- Measured on PostgreSQL 15 with fsync off (CPU only), pgbench A/B against
-- 001 in one cluster: acquire + release 1.14-1.24x as fast; a guarded
-- single-row UPDATE and a use_token transaction unchanged within the noise
-- (docs/benchmarks.md).

-- ---------------------------------------------------------------------------
-- Table fence.lease: no CHECK constraints
-- ---------------------------------------------------------------------------

-- The executor parses every CHECK constraint of a table from its stored
-- text and compiles it once per statement that writes the table (not once
-- per session): the four checks of 001 cost about 15 us on every grant,
-- renewal and release. Only the kit's own functions write this table (no
-- role but its owner has any privilege on it), and they keep the same
-- invariants: token > 0, kind one of ttl/session/revoked, a ttl lease has
-- expires_at, a session lease has session_pid, a revocation has no holder
-- and an ended_at.
ALTER TABLE fence.lease
    DROP CONSTRAINT lease_token_check,
    DROP CONSTRAINT lease_kind_check,
    DROP CONSTRAINT lease_check,
    DROP CONSTRAINT lease_check1,
    DROP CONSTRAINT lease_check2;

-- lease_durable_update fired on a WHEN condition, which the executor also
-- parses and compiles per statement. A column list (UPDATE OF) is a bitmap
-- test: the trigger fires for statements that assign token or expires_at
-- (grants and renewals), not for releases and waiter flags. The same
-- transactions as before become durable at commit.
DROP TRIGGER lease_durable_update ON fence.lease;
CREATE CONSTRAINT TRIGGER lease_durable_update AFTER UPDATE OF token, expires_at ON fence.lease
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION fence._durable();

-- ---------------------------------------------------------------------------
-- Helpers: the system identifier once per session, and inlinable tests
-- ---------------------------------------------------------------------------

-- The system identifier of the cluster this session runs on.
-- pg_control_system() reads the control file from disk on every call; a
-- backend never changes clusters, so the value is kept in the session
-- setting fence._system_identifier after the first read. fence._grant
-- compares that setting with the stored epoch state to see that it still
-- describes this server; fence._epoch, which runs only when it does not,
-- reads the control file itself as in 001. A role that sets
-- that setting by hand changes what its own grants compare against
-- fence.epoch_state: a wrong value makes its next grant move the epoch base
-- up (tokens still grow), and the right value of another cluster only
-- matters after a dump is restored into a new cluster. Neither gives a role
-- more than it already has: any role with the kit's usage can read the
-- latest token of a resource in fence.leases (docs/security.md).
CREATE FUNCTION fence._system_identifier() RETURNS bigint
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

-- Whether a lease row is live at server time now: 001's test as one SQL
-- expression. A SQL function of one expression without SET is inlined into
-- the statement that calls it, so the callers (grants, release) pay nothing
-- for the call; 001's PL/pgSQL version cost a function call each time.
CREATE OR REPLACE FUNCTION fence._live(l fence.lease, now timestamptz) RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    SELECT l.ended_at IS NULL
       AND CASE l.kind WHEN 'ttl' THEN l.expires_at > now
                       WHEN 'session' THEN fence._session_alive(l)
                       ELSE false END
$$;

-- The argument limits of fence._check_name and fence._check_ttl as
-- inlinable tests, for the entry points' fast paths below: a name of 1 to
-- 255 characters, a TTL of 10 ms to 1 day (in seconds).
CREATE FUNCTION fence._name_ok(v text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT pg_catalog.char_length(v) BETWEEN 1 AND 255 $$;

CREATE FUNCTION fence._ttl_ok(secs double precision) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT secs BETWEEN 0.01 AND 86400 $$;

-- ---------------------------------------------------------------------------
-- Grants: one read, and no subtransaction unless the grant has to wait
-- ---------------------------------------------------------------------------

-- Same contract, locking order and durability as in 001 (read the comment
-- there, or docs/design.md): the gate exclusive, then the row FOR UPDATE,
-- both held to the end of the transaction, then the token is computed from
-- the locked row. What changed is how the locks are taken:
--
-- 1. One statement reads fence.epoch_state and, without a lock, the lease
--    row. A live lease answers NULL at once as before (pollers take no lock
--    and never queue behind the holder's writers), and the epoch comes from
--    the same row unless the stored state no longer matches this server
--    (then fence._epoch updates it, as before).
-- 2. The locks are first tried without waiting: pg_try_advisory_xact_lock
--    on the gate, then FOR UPDATE SKIP LOCKED on the row. A lock that is
--    free is the same lock either way. A try on the gate fails also when
--    someone waits for it in a conflicting mode (the lock manager checks the
--    wait queue), so trying first jumps no queue and the fairness argument
--    of 001 stands. Only when one of the two is taken does the grant go to
--    the bounded wait of 001 (fence.grant_wait as a lock_timeout in an
--    exception block), which costs a subtransaction; the uncontended grant
--    no longer pays for it.
--    SKIP LOCKED finds nothing both for a locked row and for a missing one;
--    a missing row (first grant) is told apart by a plain read, and a row
--    that a racing first grant committed meanwhile is still caught by ON
--    CONFLICT DO NOTHING below, as in 001.
-- 3. The grant_wait setting is parsed only when it is set (the default,
--    2 s, needs no parsing).
CREATE OR REPLACE FUNCTION fence._grant(resource text, holder text, kind text, ttl interval, force boolean, waiting boolean) RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_variable
DECLARE
    r      record;
    l      fence.lease;
    locked boolean := false;
    epoch  bigint;
    first_tok bigint;
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
        -- A waiter that still has to ask for the NOTIFY goes on to the
        -- locks below, which set the flag (or grant, if the lease ended
        -- meanwhile). Not here: an UPDATE here would lock the row before the
        -- gate, the reverse of a grant's order, and deadlock with it.
        RETURN NULL;
    END IF;
    -- The stored epoch state still describes this server (compared with the
    -- session's cached system identifier, which the first grant of a session
    -- fills below); else fence._epoch brings it up to date, as in 001.
    IF r.system_identifier::text = pg_catalog.current_setting('fence._system_identifier', true)
       AND r.relid = 'fence.epoch_state'::pg_catalog.regclass::oid AND r.timeline = fence._timeline()
       AND r.base + r.timeline < (1::bigint << 20) THEN
        epoch := r.base + r.timeline;
    ELSE
        PERFORM fence._system_identifier();
        epoch := fence._epoch();
    END IF;
    first_tok := (epoch << 43) | 1;
    IF kind = 'session' THEN
        spid := pg_catalog.pg_backend_pid();
    END IF;
    IF pg_catalog.current_setting('synchronous_commit') = 'off' THEN
        PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    END IF;

    -- fence.grant_wait is validated whenever it is set, so that a bad value
    -- fails every grant at once and not only the first one that has to wait;
    -- parsing it takes an exception block, which the default skips.
    wait_setting := nullif(pg_catalog.current_setting('fence.grant_wait', true), '');
    IF wait_setting IS NOT NULL THEN
        BEGIN
            wait_ms := pg_catalog.ceil(pg_catalog.date_part('epoch', wait_setting::interval) * 1000)::bigint;
        EXCEPTION WHEN data_exception THEN  -- not an interval, or out of range ('infinity')
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
        -- See 001: the session-level advisory lock of (resource, token) is
        -- the lease's life; skip a token whose key a rolled-back grant left.
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

-- ---------------------------------------------------------------------------
-- Entry points: valid arguments are recognised by one expression
-- ---------------------------------------------------------------------------

-- PL/pgSQL prepares every expression of a function again in each new
-- transaction, and every call of a helper function has a cost of its own:
-- for calls that are one transaction each (the common case) that is a good
-- share of the time. So the entry points test valid arguments with a single
-- expression and call the helpers that raise the detailed errors only when
-- that test fails; errors and their order are those of 001.

CREATE OR REPLACE FUNCTION fence.acquire(resource text, holder text, ttl interval, waiting boolean DEFAULT false) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    secs double precision := pg_catalog.date_part('epoch', ttl);
BEGIN
    IF fence._name_ok(resource) AND fence._name_ok(holder) AND fence._ttl_ok(secs) THEN
        RETURN fence._grant(resource, holder, 'ttl', pg_catalog.make_interval(secs => secs), false, coalesce(waiting, false));
    END IF;
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

-- ---------------------------------------------------------------------------
-- Release: liveness inline
-- ---------------------------------------------------------------------------

-- As in 001 (fence._live is now inlined into the UPDATE), returning only the
-- three columns the rest needs.
CREATE OR REPLACE FUNCTION fence.release(resource text, token bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    now  timestamptz := pg_catalog.clock_timestamp();
    k    text;
    spid integer;
    w    boolean;
BEGIN
    IF (fence._name_ok(resource) AND token > 0) IS NOT TRUE THEN
        PERFORM fence._check_name('resource', resource);
        PERFORM fence._check_token(token);
    END IF;
    UPDATE fence.lease x SET ended_at = now
     WHERE x.resource = resource AND x.token = token AND fence._live(x, now)
    RETURNING x.kind, x.session_pid, x.waiters INTO k, spid, w;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF k = 'session' AND spid = pg_catalog.pg_backend_pid() THEN
        PERFORM pg_catalog.pg_advisory_unlock(fence._lease_key(resource, token));
    END IF;
    IF w THEN
        PERFORM fence._notify_free(resource);
    END IF;
    RETURN true;
END
$$;

-- ---------------------------------------------------------------------------
-- Guards: one check per resource and token per transaction
-- ---------------------------------------------------------------------------

-- As in 001, and on success the pair is written to the transaction-local
-- setting fence._checked as 'token:resource' (the last pair checked; a
-- string compare is all a guard then needs, where a JSON object of every
-- pair cost more to build than it saved). Why a guard may then skip
-- fence.check for the same pair later in
-- the same transaction: the first check holds the resource's gate in share
-- mode until the transaction ends, and every grant needs the gate
-- exclusive, so no grant of that resource can commit before this
-- transaction ends; the latest token it read cannot change under it, and a
-- second check could only give the same answer. The setting and the gate go
-- away together: both at the end of the transaction, and both when the
-- subtransaction that checked is rolled back (a set_config(..., true) and a
-- transaction-level advisory lock are undone by the rollback of the
-- subtransaction that made them). A role that writes the setting by hand
-- skips the check for its own writes only; it could as well read the latest
-- token from fence.leases and present it (docs/security.md: the guards stop
-- stale writers, not hostile ones).
CREATE OR REPLACE FUNCTION fence.check(resource text, token bigint) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    latest bigint;
BEGIN
    IF (fence._name_ok(resource) AND token > 0) IS NOT TRUE THEN
        PERFORM fence._check_name('resource', resource);
        IF token IS NULL THEN
            RAISE EXCEPTION 'pgfence: no fencing token presented for resource %', resource
                USING ERRCODE = 'FN002', DETAIL = format('resource=%s token=NULL', resource),
                      HINT = 'pass the token that fence.acquire returned';
        END IF;
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
    IF latest = token THEN
        PERFORM pg_catalog.set_config('fence._checked', token::text || ':' || resource, true);
        RETURN;
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

-- Row guard, as in 001 with two changes:
-- * It skips fence.check when this transaction already checked the same
--   resource and token (fence._checked; see fence.check for why that is
--   safe).
-- * It no longer pins search_path. It is SECURITY INVOKER, so a
--   search_path could only ever mislead the writing role's own guard, and
--   every name in it is qualified (functions with pg_catalog. or fence.,
--   operators with OPERATOR(pg_catalog.x)), so a schema earlier in the path
--   cannot change what it calls. Pinning cost a setting change on entry and
--   exit of every guarded row.
CREATE OR REPLACE FUNCTION fence._guard_row() RETURNS trigger
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    res text := TG_ARGV[0];
    col text := TG_ARGV[1];
    tok bigint;
    old_tok bigint;
BEGIN
    IF col IS NOT NULL AND TG_OP OPERATOR(pg_catalog.<>) 'DELETE' THEN
        tok := (pg_catalog.to_jsonb(NEW) OPERATOR(pg_catalog.->>) col)::bigint;
        IF tok IS NULL THEN
            RAISE EXCEPTION 'pgfence: no fencing token in column % of protected table %.%', col, TG_TABLE_SCHEMA, TG_TABLE_NAME
                USING ERRCODE = 'FN002', DETAIL = pg_catalog.format('resource=%s token=NULL', res),
                      HINT = pg_catalog.format('set %I to the token that fence.acquire(%L, ...) returned', col, res);
        END IF;
        IF TG_OP OPERATOR(pg_catalog.=) 'UPDATE' THEN
            old_tok := (pg_catalog.to_jsonb(OLD) OPERATOR(pg_catalog.->>) col)::bigint;
            IF old_tok OPERATOR(pg_catalog.>) tok THEN
                RAISE EXCEPTION 'pgfence: stale fencing token % for resource %: the row already carries token %', tok, res, old_tok
                    USING ERRCODE = 'FN001', DETAIL = pg_catalog.format('resource=%s token=%s row_token=%s', res, tok, old_tok),
                          HINT = 'an update may never lower the token column; acquire the lease again and use the new token';
            END IF;
        END IF;
    ELSE
        tok := fence._registered_token(res, TG_OP, pg_catalog.format('%I.%I', TG_TABLE_SCHEMA, TG_TABLE_NAME));
    END IF;
    IF pg_catalog.current_setting('fence._checked', true) OPERATOR(pg_catalog.=)
           (tok::text OPERATOR(pg_catalog.||) ':' OPERATOR(pg_catalog.||) res) THEN
        RETURN NULL;
    END IF;
    PERFORM fence.check(res, tok);
    RETURN NULL;
END
$$;

-- The token fence.use_token registered, as in 001, written for a caller that
-- does not pin search_path (the guards above).
CREATE OR REPLACE FUNCTION fence._registered_token(res text, op text, tbl text) RETURNS bigint
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    m   text := pg_catalog.current_setting('fence.tokens', true);
    tok bigint;
BEGIN
    IF m OPERATOR(pg_catalog.<>) '' THEN
        tok := (m::pg_catalog.jsonb OPERATOR(pg_catalog.->>) res)::bigint;
    END IF;
    IF tok IS NULL THEN
        RAISE EXCEPTION 'pgfence: no fencing token for % on protected table %', op, tbl
            USING ERRCODE = 'FN002', DETAIL = pg_catalog.format('resource=%s token=NULL', res),
                  HINT = pg_catalog.format('call fence.use_token(%L, token) earlier in this transaction', res);
    END IF;
    RETURN tok;
END
$$;

CREATE OR REPLACE FUNCTION fence.version() RETURNS integer
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT 2 $$;

-- As in 001: nothing in the kit is usable by PUBLIC (the new helpers run
-- inside the entry points only).
REVOKE ALL ON FUNCTION fence._system_identifier(), fence._name_ok(text), fence._ttl_ok(double precision) FROM PUBLIC;
