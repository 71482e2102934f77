-- pgfence 008: what the second review found (issue 19's red team), and
-- refusals counted by the database (issue 22).
--
-- What changes, each with the test that failed on 007 (the proofs are in
-- docs/design.md; the reference in docs/sql.md):
--
-- 1. A foreign-key action that assigns the token column the row's own value
--    (ON UPDATE CASCADE of a key that includes it, when only the referenced
--    key changed) presents no token: the writer named none. The mark
--    trigger leaves such a row unmarked and the row guard asks for a
--    registered token (TestCascadeOfACompositeKeyPresentsTheRowsToken).
-- 2. The kit creates no guard function for a temporary table (TEMP is
--    PUBLIC's, so every role owns one when it likes) or for a name that is
--    not a column of the table; fence.protect and fence.protect_rows refuse
--    temporary tables (TestTemporaryTableMakesTheKitCreateFunctions).
-- 3. The token floor that fence.protect raises is also kept in the sequence
--    fence.epoch_floor, which every grant reads (a sequence is read outside
--    snapshots): a grant whose snapshot predates the raise no longer trusts
--    the epoch cache it sees (TestGrantUnderAnOlderSnapshotIgnoresARaisedFloor).
-- 4. The first grant after the epoch cache was lost waits for the epoch
--    state at most fence.grant_wait, and is then busy, like any grant
--    (TestFirstGrantAfterCacheLossHoldsEveryGrantUnbounded).
-- 5. A grant that had to wait locks the lease row outside a
--    subtransaction, so that its UPDATE leaves a plain xmax and not a
--    MultiXact whose committed locker a later key-share lock would skip
--    (TestRenewalThenAWaitingGrantLetsAnOlderSnapshotPass).
-- 6. Every refusal (FN001, FN002, FN003) counts itself in a sequence on its
--    failing path (a sequence is not rolled back with the transaction it
--    fails); fence.refusals shows the counts, fence.leases the time left
--    (expires_in).

-- And fewer steps on the accepted paths (issue 20; figures in
-- docs/benchmarks.md):
--
-- 7. The table-wide guard does less per row (fence._guard_source): the
--    token read inline, one fast query after the gate under READ
--    COMMITTED, everything else in fence._guard_slow. Its read comes after
--    the gate, so a version that someone only locked (a REPEATABLE READ
--    writer, a large per-row statement) no longer sends every later write
--    to the slow path.
-- 8. fence.check and fence.use_token have the same fast path (fence._check
--    is the full check, as fence.check was).
-- 9. The grant's durability trigger runs with the caller's rights and no
--    settings of its own (fence._durable).
-- 10. The per-row statement guard reads its transition tables and the
--    table's inheritance children in one query, and takes a single
--    resource's gate without a PERFORM.
-- 11. fence.protected.enabled is false for a guard trigger that fires in
--    replica mode only.

-- ---------------------------------------------------------------------------
-- Sequences
-- ---------------------------------------------------------------------------

-- The lowest epoch a grant may use (fence._raise_floor moves it up, never
-- down). Read by every grant with pg_sequence_last_value, which sees the
-- latest value whatever the reader's snapshot.
CREATE SEQUENCE fence.epoch_floor AS bigint MINVALUE 0 START WITH 0;
SELECT pg_catalog.setval('fence.epoch_floor', 0, true);
COMMENT ON SEQUENCE fence.epoch_floor IS 'pgfence internal: the lowest token epoch a grant may use (raised by fence.protect)';

-- One counter per refusal, advanced on the failing path only.
CREATE SEQUENCE fence.refusals_fn001 AS bigint;
CREATE SEQUENCE fence.refusals_fn002 AS bigint;
CREATE SEQUENCE fence.refusals_fn003 AS bigint;
COMMENT ON SEQUENCE fence.refusals_fn001 IS 'pgfence internal: refusals with FN001 (stale token) in this database; read fence.refusals';
COMMENT ON SEQUENCE fence.refusals_fn002 IS 'pgfence internal: refusals with FN002 (no token) in this database; read fence.refusals';
COMMENT ON SEQUENCE fence.refusals_fn003 IS 'pgfence internal: refusals with FN003 (token never granted) in this database; read fence.refusals';

-- ---------------------------------------------------------------------------
-- Refusals
-- ---------------------------------------------------------------------------

-- Counts a refusal, then raises it. SECURITY DEFINER: the guards run with
-- the writer's rights, and the writer has no privilege on the sequences.
-- Not counted in a read-only transaction (nextval would fail there, on a
-- standby too, and replace the refusal's SQLSTATE with its own).
CREATE FUNCTION fence._refuse(code text, message text, detail text, hint text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF current_setting('transaction_read_only') = 'off' THEN
        PERFORM nextval(CASE code WHEN 'FN001' THEN 'fence.refusals_fn001'::regclass
                                  WHEN 'FN002' THEN 'fence.refusals_fn002'::regclass
                                  WHEN 'FN003' THEN 'fence.refusals_fn003'::regclass END);
    END IF;
    RAISE EXCEPTION USING ERRCODE = code, MESSAGE = message, DETAIL = detail, HINT = hint;
END
$$;

-- The full check, as fence.check was up to 007 (the argument errors, the
-- gate waited for, the row read under READ COMMITTED or locked FOR KEY
-- SHARE otherwise, the refusals, now counted). Internal: fence.check and
-- fence.use_token call it when their fast path does not apply.
CREATE FUNCTION fence._check(resource text, token bigint) RETURNS void
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
            PERFORM fence._refuse('FN002', format('pgfence: no fencing token presented for resource %s', resource),
                format('resource=%s token=NULL', resource), 'pass the token that fence.acquire returned');
        END IF;
        PERFORM fence._refuse('FN003', format('pgfence: unknown fencing token %s for resource %s: tokens are positive', token, resource),
            format('resource=%s token=%s', resource, token), 'pass the token that fence.acquire returned for this resource');
    END IF;
    -- The gate is taken in a subtransaction of its own. PostgreSQL files a
    -- lock under the resource owner current when it is taken: in a cursor's
    -- query that is the cursor's portal, whose locks go when a later FETCH
    -- of it fails inside a savepoint, while the rows written stay. When a
    -- subtransaction commits, its locks pass to the transaction's own
    -- resource owner, and stay until the transaction ends
    -- (TestRedteam8FailedCursorFetchDropsTheGate).
    BEGIN
        PERFORM pg_catalog.pg_advisory_xact_lock_shared(fence._gate_key(resource));
    EXCEPTION WHEN OTHERS THEN
        RAISE;
    END;
    -- No exemption for a READ ONLY transaction: transaction_read_only can be
    -- turned on for one statement or function and off again (a released
    -- savepoint, a function's SET), so it says nothing of what the
    -- transaction commits (TestRedteam8bReadOnlyTurnedOnMidStatement). A
    -- snapshot transaction that may not lock the row fails (25006).
    IF pg_catalog.current_setting('transaction_isolation') = 'read committed' THEN
        SELECT x.token INTO latest FROM fence.lease x WHERE x.resource = resource;
    ELSE
        SELECT x.token INTO latest FROM fence.lease x WHERE x.resource = resource FOR KEY SHARE;
    END IF;
    IF latest = token THEN
        RETURN;
    END IF;
    IF latest IS NULL THEN
        PERFORM fence._refuse('FN003', format('pgfence: unknown fencing token %s for resource %s: it has never been granted', token, resource),
            format('resource=%s token=%s latest=none', resource, token), 'acquire a lease on this resource first and use the token it returns');
    ELSIF token < latest THEN
        PERFORM fence._refuse('FN001', format('pgfence: stale fencing token %s for resource %s: a newer lease (token %s) was granted', token, resource, latest),
            format('resource=%s token=%s latest=%s', resource, token, latest),
            'this holder lost the lease: stop writing, acquire the lease again and redo the work under the new token');
    ELSE
        PERFORM fence._refuse('FN003', format('pgfence: unknown fencing token %s for resource %s: it was never granted', token, resource),
            format('resource=%s token=%s latest=%s', resource, token, latest), 'use the token that fence.acquire returned for this resource');
    END IF;
END
$$;

-- As in 003, with a fast path under READ COMMITTED: the gate tried, then
-- the lease row read by a query of its own, accepted when the token matches
-- (the argument of the guards' fast path, fence._guard_source). Everything
-- else, fence._check.
CREATE OR REPLACE FUNCTION fence.check(resource text, token bigint) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    ok boolean;
BEGIN
    IF current_setting('transaction_isolation') = 'read committed' THEN
        BEGIN  -- a subtransaction of its own, as in fence._check
            ok := pg_try_advisory_xact_lock_shared(fence._gate_key(resource));
        EXCEPTION WHEN OTHERS THEN
            RAISE;
        END;
        IF ok THEN
            SELECT x.token = token INTO ok FROM fence.lease x WHERE x.resource = resource;
        END IF;
    END IF;
    IF ok IS NOT TRUE THEN
        PERFORM fence._check(resource, token);
    END IF;
END
$$;

-- As in 003, with fence.check's fast path inline (one SECURITY DEFINER
-- call, not two), then the token registered in the transaction's
-- fence.tokens.
CREATE OR REPLACE FUNCTION fence.use_token(resource text, token bigint) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    ok  boolean;
    reg text;
BEGIN
    IF current_setting('transaction_isolation') = 'read committed' THEN
        BEGIN  -- a subtransaction of its own, as in fence._check
            ok := pg_try_advisory_xact_lock_shared(fence._gate_key(resource));
        EXCEPTION WHEN OTHERS THEN
            RAISE;
        END;
        IF ok THEN
            SELECT x.token = token INTO ok FROM fence.lease x WHERE x.resource = resource;
        END IF;
    END IF;
    IF ok IS NOT TRUE THEN
        PERFORM fence._check(resource, token);
    END IF;
    reg := set_config('fence.tokens',
        jsonb_set(coalesce(nullif(current_setting('fence.tokens', true), '')::jsonb, '{}'::jsonb), ARRAY[resource], to_jsonb(token))::text, true);
END
$$;

-- The grant's durability trigger, as in 003 but with the caller's rights
-- and no settings of its own: it only turns synchronous_commit on for the
-- transaction (any role may), with fence._force_durable's expression inline
-- and every name and operator qualified, so SECURITY DEFINER and its pinned
-- search_path bought nothing but a context switch per grant. (A deferred
-- trigger runs as whoever commits; it names nothing in schema fence.)
CREATE OR REPLACE FUNCTION fence._durable() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $$
DECLARE
    durable pg_catalog.text;
BEGIN
    durable := CASE WHEN pg_catalog.current_setting('synchronous_commit') OPERATOR(pg_catalog.=) 'off'
                    THEN pg_catalog.set_config('synchronous_commit', 'on', true) END;
    RETURN NULL;
END
$$;

-- As in 003, the refusal through fence._refuse.
CREATE OR REPLACE FUNCTION fence._registered_token(res text, op text, rel oid) RETURNS bigint
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    m   pg_catalog.text := pg_catalog.current_setting('fence.tokens', true);
    tok pg_catalog.int8;
BEGIN
    IF m OPERATOR(pg_catalog.<>) '' THEN
        tok := (m::pg_catalog.jsonb OPERATOR(pg_catalog.->>) res)::bigint;
    END IF;
    IF tok IS NULL THEN
        PERFORM fence._refuse('FN002',
            pg_catalog.format('pgfence: no fencing token for %s on protected table %s', op, rel::pg_catalog.regclass),
            pg_catalog.format('resource=%s token=NULL', res),
            pg_catalog.format('assign the token column in the statement, or call fence.use_token(%L, token) earlier in this transaction', res));
    END IF;
    RETURN tok;
END
$$;

-- As in 004, the refusals through fence._refuse.
CREATE OR REPLACE FUNCTION fence._check_many(res text[], tok bigint[], op text, rel oid) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    found_n bigint;
    stale   boolean;
    bad     record;
BEGIN
    -- Lock and compare in one pass: one index probe per resource (LATERAL,
    -- so that no plan hashes the whole of fence.lease to find a few rows).
    SELECT count(*), coalesce(bool_or(n.t IS DISTINCT FROM l.token), false) INTO found_n, stale
      FROM unnest(res, tok) AS n(r, t),
           LATERAL (SELECT x.token FROM fence.lease x WHERE x.resource = n.r FOR KEY SHARE) l;
    IF found_n = cardinality(res) AND NOT stale THEN
        RETURN;
    END IF;
    -- The first entry that fails, for the error (this path ends the statement).
    SELECT n.r, n.t INTO bad
      FROM unnest(res, tok) WITH ORDINALITY AS n(r, t, i)
      LEFT JOIN fence.lease x ON x.resource = n.r
     WHERE n.r IS NULL OR n.t IS NULL OR x.token IS DISTINCT FROM n.t
     ORDER BY n.i LIMIT 1;
    IF bad.r IS NULL THEN
        PERFORM fence._refuse('FN003', format('pgfence: a row of %s has no resource: its resource column is NULL', rel::regclass),
            'resource=NULL', 'declare the resource column NOT NULL');
    END IF;
    IF bad.t IS NULL THEN
        PERFORM fence._registered_token(bad.r, op, rel);
    END IF;
    PERFORM fence.check(bad.r, bad.t);
    -- fence.check passed: the lease row changed between the two reads (it
    -- cannot while we hold the gate or the lock; refuse all the same)
    PERFORM fence._refuse('FN001', format('pgfence: stale fencing token %s for resource %s', bad.t, bad.r),
        format('resource=%s token=%s', bad.r, bad.t), 'acquire the lease again and use the new token');
END
$$;

-- What fence.refusals shows: each refusal's SQLSTATE, what it means and how
-- many there were in this database since the install (a sequence: after a
-- crash the count may run up to 32 ahead, never behind a committed read).
CREATE VIEW fence.refusals AS
SELECT 'FN001'::text AS sqlstate, 'stale token'::text AS reason,
       CASE WHEN s.is_called THEN s.last_value ELSE 0 END AS count FROM fence.refusals_fn001 s
UNION ALL
SELECT 'FN002', 'no token', CASE WHEN s.is_called THEN s.last_value ELSE 0 END FROM fence.refusals_fn002 s
UNION ALL
SELECT 'FN003', 'token never granted', CASE WHEN s.is_called THEN s.last_value ELSE 0 END FROM fence.refusals_fn003 s;
COMMENT ON VIEW fence.refusals IS 'refused tokens counted by SQLSTATE (FN001 stale, FN002 none, FN003 never granted) in this database since the install';

-- As in 001, and the time left of a TTL lease that has not ended
-- (negative once it expired); NULL for other kinds.
CREATE OR REPLACE VIEW fence.leases AS
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
       l.session_pid,
       CASE WHEN l.kind = 'ttl' AND l.ended_at IS NULL THEN l.expires_at - pg_catalog.clock_timestamp() END AS expires_in
  FROM fence.lease l;
COMMENT ON VIEW fence.leases IS
    'every resource ever granted: holder, latest token, kind (ttl, session, revoked), times, whether the lease is live now by the server clock, and the time left of a TTL lease (expires_in)';

-- ---------------------------------------------------------------------------
-- The grant
-- ---------------------------------------------------------------------------

-- As in 007, and the cache is good only at or above fence.epoch_floor.
CREATE OR REPLACE FUNCTION fence._cache_epoch(c fence.epoch_cache) RETURNS bigint
LANGUAGE sql VOLATILE
AS $$
    SELECT CASE WHEN c.system_identifier OPERATOR(pg_catalog.=) fence._system_identifier()
                 AND c.datoid OPERATOR(pg_catalog.=) fence._database_oid()
                 AND c.relid OPERATOR(pg_catalog.=) 'fence.epoch_state'::pg_catalog.regclass::pg_catalog.oid
                 AND c.timeline OPERATOR(pg_catalog.=) fence._timeline()
                 AND c.base OPERATOR(pg_catalog.+) c.timeline OPERATOR(pg_catalog.<) (1::pg_catalog.int8 OPERATOR(pg_catalog.<<) 20)
                 AND c.base OPERATOR(pg_catalog.+) c.timeline OPERATOR(pg_catalog.>=) pg_catalog.pg_sequence_last_value('fence.epoch_floor'::pg_catalog.regclass)
           THEN c.base OPERATOR(pg_catalog.+) c.timeline END
$$;

-- As in 007, with two changes. The locks come first (the state row, the
-- flush table): under fence._epoch_within's lock_timeout, nothing is done
-- before they are held, so a grant that gives up has moved nothing. And
-- the epoch is at least fence.epoch_floor.
CREATE OR REPLACE FUNCTION fence._epoch() RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    sysid bigint := fence._system_identifier();
    mydb  oid := fence._database_oid();
    myrel oid := 'fence.epoch_state'::pg_catalog.regclass::oid;
    tli   bigint := fence._timeline();
    s     fence.epoch_state;
    home  boolean;
    nbase bigint;
    floor bigint;
BEGIN
    IF NOT EXISTS (SELECT FROM fence.epoch_state) THEN
        -- First grant of this install, or of a restore that brought lease
        -- rows but no state: start past every stored token.
        INSERT INTO fence.epoch_state (system_identifier, relid, timeline, base)
        VALUES (sysid, myrel, tli, coalesce((SELECT max(l.token) >> 43 FROM fence.lease l), 0))
        ON CONFLICT DO NOTHING;
    END IF;
    SELECT * INTO s FROM fence.epoch_state FOR UPDATE;
    -- This transaction's commit is flushed before it returns, whatever
    -- synchronous_commit is at COMMIT: the counter's move and the new state
    -- are durable before any token above them is used.
    TRUNCATE fence.commit_flush;
    -- At home: exactly the row the migration (or the last restore below)
    -- wrote for this database of this cluster.
    SELECT coalesce(count(*) = 1 AND bool_and(o.datoid = mydb AND o.system_identifier = sysid), false)
      INTO home FROM fence.origin o;
    IF s.system_identifier = sysid AND s.relid = myrel AND home AND s.timeline < tli THEN
        nbase := s.base;  -- promotion: the timeline alone moves the epoch up
        UPDATE fence.epoch_state SET timeline = tli;
    ELSIF s.system_identifier <> sysid OR s.relid <> myrel OR NOT home OR s.timeline > tli THEN
        -- a restored copy (another cluster, another database, a template
        -- copy) or a timeline that went back: move past every epoch this
        -- data has seen
        nbase := greatest(s.base + s.timeline,
                          coalesce((SELECT max(l.token) >> 43 FROM fence.lease l), 0));
        UPDATE fence.epoch_state SET system_identifier = sysid, relid = myrel, timeline = tli, base = nbase;
        DELETE FROM fence.origin;
        INSERT INTO fence.origin (datoid, system_identifier) VALUES (mydb, sysid);
    ELSE
        nbase := s.base;  -- just created, or another grant updated it while we waited
    END IF;
    floor := pg_catalog.pg_sequence_last_value('fence.epoch_floor'::pg_catalog.regclass);
    IF nbase + tli < floor THEN
        nbase := floor - tli;
        UPDATE fence.epoch_state SET base = nbase;
    END IF;
    IF nbase + tli >= (1::bigint << 20) THEN
        RAISE EXCEPTION 'pgfence token epochs are exhausted (epoch %)', nbase + tli
            USING ERRCODE = '54000',
                  HINT = 'the token layout allows 2^20 epochs (promotions and restores); see docs/design.md';
    END IF;
    -- An empty cache file: crash recovery (or a promotion, or a restore of
    -- the files) emptied it, and grants made before may be lost with their
    -- commits, while their callers hold the tokens. They took at most one
    -- counter value each, and no crash loses 2^32 of them: the counter moves
    -- past them all. (setval is not rolled back; a rolled-back attempt
    -- leaves a dead row in the file, so a retry does not move it again.)
    IF pg_catalog.pg_relation_size('fence.epoch_cache'::pg_catalog.regclass) = 0 THEN
        PERFORM pg_catalog.setval('fence.token_counter', (SELECT c.last_value FROM fence.token_counter c) + 4294967296);
    END IF;
    DELETE FROM fence.epoch_cache;
    INSERT INTO fence.epoch_cache (system_identifier, datoid, relid, timeline, base)
    VALUES (sysid, mydb, myrel, tli, nbase);
    RETURN nbase + tli;
END
$$;

-- fence._epoch for a grant: its locks wait at most wait_ms (a grant that
-- validates the epoch state holds them until it commits, and every other
-- grant that finds no good cache row until then waits for them); NULL when
-- they were not free in time, and the grant is then busy.
CREATE FUNCTION fence._epoch_within(wait_ms bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    prev pg_catalog.text := pg_catalog.current_setting('lock_timeout');
    e    pg_catalog.int8;
BEGIN
    PERFORM pg_catalog.set_config('lock_timeout', wait_ms::pg_catalog.text, true);
    BEGIN
        e := fence._epoch();
    EXCEPTION WHEN lock_not_available THEN
        e := NULL;
    END;
    PERFORM pg_catalog.set_config('lock_timeout', prev, true);
    RETURN e;
END
$$;

-- As in 005, except that the row is locked outside any subtransaction. A
-- row lock taken in a subtransaction has another xid than the UPDATE that
-- follows in the grant, and the version the grant replaces then carries a
-- MultiXact (a locker, a no-key update); a REPEATABLE READ check whose
-- key-share lock follows the update chain there counts the committed
-- locker for nothing and the no-key update as no conflict, and passes with
-- the superseded token. So the gate is waited for under lock_timeout in a
-- subtransaction (an advisory lock: no row, no xid), and the row is taken
-- at the top level with SKIP LOCKED, again until the deadline. Whoever
-- holds the row lock once we hold the gate is a renewal or a release (a
-- guarded writer holds the gate too) or a large per-row statement's
-- key-share lock: the wait is short, or the grant is busy.
CREATE OR REPLACE FUNCTION fence._lock_lease(res text, wait_ms bigint, OUT locked boolean, OUT lease fence.lease) RETURNS record
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    prev     pg_catalog.text;
    gate     pg_catalog.bool;
    deadline pg_catalog.timestamptz;
BEGIN
    BEGIN  -- a subtransaction of its own, as in fence._check
        gate := pg_catalog.pg_try_advisory_xact_lock(fence._gate_key(res));
    EXCEPTION WHEN OTHERS THEN
        RAISE;
    END;
    IF gate THEN
        SELECT * INTO lease FROM fence.lease x WHERE x.resource OPERATOR(pg_catalog.=) res FOR UPDATE SKIP LOCKED;
        locked := FOUND OR NOT EXISTS (SELECT 1 FROM fence.lease x WHERE x.resource OPERATOR(pg_catalog.=) res);
        IF locked THEN
            RETURN;
        END IF;
    END IF;
    deadline := pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) pg_catalog.make_interval(secs => wait_ms OPERATOR(pg_catalog./) 1000.0);
    IF NOT gate THEN
        prev := pg_catalog.current_setting('lock_timeout');
        PERFORM pg_catalog.set_config('lock_timeout', wait_ms::pg_catalog.text, true);
        BEGIN
            PERFORM pg_catalog.pg_advisory_xact_lock(fence._gate_key(res));
        EXCEPTION WHEN lock_not_available THEN
            locked := false;
        END;
        PERFORM pg_catalog.set_config('lock_timeout', prev, true);
        IF locked IS FALSE THEN
            RETURN;
        END IF;
    END IF;
    LOOP
        SELECT * INTO lease FROM fence.lease x WHERE x.resource OPERATOR(pg_catalog.=) res FOR UPDATE SKIP LOCKED;
        locked := FOUND OR NOT EXISTS (SELECT 1 FROM fence.lease x WHERE x.resource OPERATOR(pg_catalog.=) res);
        IF locked OR pg_catalog.clock_timestamp() OPERATOR(pg_catalog.>=) deadline THEN
            RETURN;
        END IF;
        PERFORM pg_catalog.pg_sleep(0.001);
    END LOOP;
END
$$;

-- As in 007; the first grant after the cache was lost waits for the epoch
-- state at most fence.grant_wait (fence._epoch_within).
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
    SELECT c AS cache, x AS lease INTO r
      FROM fence.epoch_cache c LEFT JOIN fence.lease x ON x.resource = resource;
    l := r.lease;
    IF NOT force AND fence._live(l, pg_catalog.clock_timestamp()) AND (NOT waiting OR l.waiters) THEN
        RETURN NULL;
    END IF;
    epoch := fence._cache_epoch(r.cache);
    IF epoch IS NULL THEN
        epoch := fence._epoch_within(fence._grant_wait());
        IF epoch IS NULL THEN
            RETURN NULL;  -- busy: another grant is validating the epoch state
        END IF;
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

-- As in 007, and the new epoch is also the floor every grant reads.
CREATE OR REPLACE FUNCTION fence._raise_floor(floor bigint) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    e bigint;
    s fence.epoch_state;
BEGIN
    IF floor IS NULL OR floor <= fence._token_floor() THEN
        RETURN;
    END IF;
    e := fence._epoch();  -- creates or refreshes the state row
    SELECT * INTO s FROM fence.epoch_state FOR UPDATE;
    IF (floor >> 43) + 1 >= (1::bigint << 20) THEN
        RAISE EXCEPTION 'pgfence: token % is beyond the last epoch; no later token can be granted', floor
            USING ERRCODE = '54000',
                  HINT = 'the token column holds values that were never pgfence tokens: clear them (set them to NULL) and protect again';
    END IF;
    -- A grant whose snapshot predates this transaction sees the old state
    -- and cache; it reads the sequence all the same (fence._cache_epoch).
    PERFORM setval('fence.epoch_floor', greatest(pg_sequence_last_value('fence.epoch_floor'::regclass), (floor >> 43) + 1), true);
    UPDATE fence.epoch_state SET base = (floor >> 43) + 1 - s.timeline;
    DELETE FROM fence.epoch_cache;
END
$$;


-- ---------------------------------------------------------------------------
-- Who makes the kit create guard functions
-- ---------------------------------------------------------------------------

-- As in 007, and never for a temporary table: TEMP is PUBLIC's, so every
-- role owns a temporary table whenever it likes.
CREATE OR REPLACE FUNCTION fence._guard_maker(tbl regclass) RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF (SELECT c.relpersistence FROM pg_class c WHERE c.oid = tbl) = 't' THEN
        RAISE EXCEPTION 'pgfence: % is a temporary table, and the kit does not guard temporary tables', tbl
            USING ERRCODE = '42809', HINT = 'a temporary table is seen by its own session only: protect an ordinary table';
    END IF;
    IF pg_has_role(fence._acting_role(), (SELECT c.relowner FROM pg_class c WHERE c.oid = tbl), 'USAGE') IS NOT TRUE THEN
        RAISE EXCEPTION 'pgfence: only the owner of table % can make the kit create its guard', tbl
            USING ERRCODE = '42501', HINT = 'run fence.protect or fence.protect_rows as the role that owns the table';
    END IF;
END
$$;

-- Raises 42703 unless every name in cols (NULLs aside) is a column of tbl.
CREATE FUNCTION fence._columns_of(tbl regclass, cols name[]) RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    missing name;
BEGIN
    SELECT u.c INTO missing FROM unnest(cols) AS u(c)
     WHERE u.c IS NOT NULL
       AND NOT EXISTS (SELECT FROM pg_attribute a
                        WHERE a.attrelid = tbl AND a.attname = u.c AND a.attnum > 0 AND NOT a.attisdropped)
     LIMIT 1;
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'pgfence: table % has no column %', tbl, quote_ident(missing)
            USING ERRCODE = '42703', HINT = 'name a column of the table';
    END IF;
END
$$;

-- As in 007, for columns of the table only.
CREATE OR REPLACE FUNCTION fence._guard_function(tbl regclass, col name) RETURNS regprocedure
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    fname text := '_guard_' || md5(col);
    fn    regprocedure;
    rl    name;
BEGIN
    PERFORM fence._guard_maker(tbl);
    PERFORM fence._columns_of(tbl, ARRAY[col]);
    -- concurrent first protects of one column name: one creates, the other waits
    PERFORM pg_advisory_xact_lock(fence._gate_key('guard function ' || fname));
    fn := to_regprocedure(format('fence.%I()', fname));
    EXECUTE format('CREATE OR REPLACE FUNCTION fence.%I() RETURNS trigger LANGUAGE plpgsql VOLATILE AS %L', fname, fence._guard_source(col));
    IF fn IS NULL THEN
        EXECUTE format('COMMENT ON FUNCTION fence.%I() IS %L', fname,
                       format('pgfence row guard of tables whose token column is %I (body: fence._guard_source(%L))', col, col));
        EXECUTE format('REVOKE ALL ON FUNCTION fence.%I() FROM PUBLIC', fname);
        fn := format('fence.%I()', fname)::regprocedure;
        -- the roles granted fence.protect themselves (members inherit)
        FOR rl IN SELECT r.rolname FROM pg_roles r, pg_proc p, aclexplode(p.proacl) x
                   WHERE p.oid = 'fence.protect(regclass, text, name)'::regprocedure
                     AND x.grantee = r.oid AND x.privilege_type = 'EXECUTE' LOOP
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', fn, rl);
        END LOOP;
    END IF;
    RETURN fn;
END
$$;


-- As in 007, for columns of the table only.
CREATE OR REPLACE FUNCTION fence._rows_function(tbl regclass, rcol name, tcol name) RETURNS regprocedure
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    fname text := '_rows_' || md5(format('%I,%s', rcol, coalesce(quote_ident(tcol), '')));
    fn    regprocedure;
    rl    name;
BEGIN
    PERFORM fence._guard_maker(tbl);
    PERFORM fence._columns_of(tbl, ARRAY[rcol, tcol]);
    PERFORM pg_advisory_xact_lock(fence._gate_key('guard function ' || fname));
    fn := to_regprocedure(format('fence.%I()', fname));
    EXECUTE format('CREATE OR REPLACE FUNCTION fence.%I() RETURNS trigger LANGUAGE plpgsql VOLATILE AS %L', fname, fence._rows_source(rcol, tcol));
    IF fn IS NULL THEN
        EXECUTE format('COMMENT ON FUNCTION fence.%I() IS %L', fname,
                       format('pgfence guard of per-row tables whose resource column is %I and token column %s (body: fence._rows_source(%L, %L))',
                              rcol, coalesce(quote_ident(tcol), 'none'), rcol, tcol));
        EXECUTE format('REVOKE ALL ON FUNCTION fence.%I() FROM PUBLIC', fname);
        fn := format('fence.%I()', fname)::regprocedure;
        FOR rl IN SELECT r.rolname FROM pg_roles r, pg_proc p, aclexplode(p.proacl) x
                   WHERE p.oid = 'fence.protect_rows(regclass, name, text, name)'::regprocedure
                     AND x.grantee = r.oid AND x.privilege_type = 'EXECUTE' LOOP
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', fn, rl);
        END LOOP;
    END IF;
    RETURN fn;
END
$$;


-- As in 004, and not a temporary table.
CREATE OR REPLACE FUNCTION fence._protectable(tbl regclass) RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c record;
BEGIN
    SELECT r.relkind, r.relpersistence, n.nspname INTO c
      FROM pg_class r JOIN pg_namespace n ON n.oid = r.relnamespace WHERE r.oid = tbl;
    IF c.nspname = 'fence' THEN
        RAISE EXCEPTION 'pgfence: % belongs to the kit itself and cannot be protected', tbl
            USING ERRCODE = '42809', HINT = 'protect your application''s tables';
    END IF;
    IF c.relkind <> 'r' THEN
        RAISE EXCEPTION 'pgfence: % is not an ordinary table', tbl
            USING ERRCODE = '42809', HINT = 'protect a plain table; partitioned tables and views cannot be protected';
    END IF;
    IF c.relpersistence = 't' THEN
        RAISE EXCEPTION 'pgfence: % is a temporary table, and the kit does not guard temporary tables', tbl
            USING ERRCODE = '42809', HINT = 'a temporary table is seen by its own session only: protect an ordinary table';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = tbl OR i.inhparent = tbl) THEN
        RAISE EXCEPTION 'pgfence: % is part of an inheritance or partition tree', tbl
            USING ERRCODE = '42809', HINT = 'protect a plain table with no parent and no children (it may be attached as a partition afterwards)';
    END IF;
END
$$;

-- ---------------------------------------------------------------------------
-- Guards
-- ---------------------------------------------------------------------------

-- What a table-wide guard does when its fast path does not apply: the
-- acting role's usage (when current_user is another role), the token
-- fence.use_token registered (FN002 when none), the full check (the gate
-- waited for, the row locked under REPEATABLE READ, the error worded), and
-- an UPDATE that would lower the token column (FN001). Returns the token
-- the write presents. Invoker: it runs with the writer's rights.
CREATE FUNCTION fence._guard_slow(res text, tok bigint, row_token bigint, op text, rel oid) RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF CURRENT_USER OPERATOR(pg_catalog.<>) fence._acting_role() THEN
        PERFORM fence._acting_role_check(rel);
    END IF;
    IF tok IS NULL THEN
        tok := fence._registered_token(res, op, rel);
    END IF;
    PERFORM fence.check(res, tok);
    IF op OPERATOR(pg_catalog.=) 'UPDATE' AND row_token OPERATOR(pg_catalog.>) tok THEN
        PERFORM fence._refuse('FN001',
            pg_catalog.format('pgfence: stale fencing token %s for resource %s: the row already carries token %s', tok, res, row_token),
            pg_catalog.format('resource=%s token=%s row_token=%s', res, tok, row_token),
            'an update may never lower the token column; acquire the lease again and use the new token');
    END IF;
    RETURN tok;
END
$$;

-- The table-wide guards (docs/design.md, "Fail closed", "Linearizable
-- fencing"), rebuilt for fewer steps per row: one format() with %1$I for the
-- column, as in 007.
--
-- The mark trigger (UPDATE OF the column) negates an assigned token, so
-- that the row guard after it can tell it from a carried one; a foreign-key
-- action that assigns the row's own value (ON UPDATE CASCADE of a key that
-- includes the column, when only the referenced key changed) runs inside
-- another trigger (pg_trigger_depth() > 1) and is left unmarked: the writer
-- named no token, and the row guard asks for a registered one.
--
-- The row guard's fast path, under READ COMMITTED only: the gate tried,
-- then the lease row read by a query of its own. That query's snapshot is
-- taken after the gate is held, so it sees every grant that committed
-- before (a grant takes the gate before it changes the row), and none can
-- commit until this transaction ends: a matching token is the latest.
-- REPEATABLE READ and SERIALIZABLE (an older snapshot), and every refusal,
-- go to fence._guard_slow, which locks the lease row as 007 did. Every
-- operator is qualified (NULLIF and IS DISTINCT FROM would resolve = by the
-- caller's search_path, and a cascade runs this as the table's owner).
CREATE OR REPLACE FUNCTION fence._guard_source(col name) RETURNS text
LANGUAGE sql IMMUTABLE
AS $f$
    SELECT pg_catalog.format(pg_catalog.concat(
$s$
DECLARE
    res pg_catalog.text;
    tok pg_catalog.int8;
    ok  pg_catalog.bool;
BEGIN
$s$,
        CASE WHEN col IS NOT NULL THEN
$s$
    IF TG_NAME OPERATOR(pg_catalog.=) '~fence_guard_0_mark' THEN
        IF NEW.%1$I OPERATOR(pg_catalog.>) 0
           AND (OLD.%1$I IS NULL OR NEW.%1$I OPERATOR(pg_catalog.<>) OLD.%1$I OR pg_catalog.pg_trigger_depth() OPERATOR(pg_catalog.=) 1) THEN
            NEW.%1$I := OPERATOR(pg_catalog.-) NEW.%1$I;
        ELSIF NEW.%1$I OPERATOR(pg_catalog.<=) 0 THEN
            PERFORM fence.check(TG_ARGV[0], NEW.%1$I);
        END IF;
        RETURN NEW;
    END IF;
    res := TG_ARGV[0];
    IF TG_OP OPERATOR(pg_catalog.=) 'UPDATE' THEN
        IF NEW.%1$I OPERATOR(pg_catalog.<) 0 AND (OLD.%1$I IS NULL OR NEW.%1$I OPERATOR(pg_catalog.<>) OLD.%1$I) THEN
            tok := OPERATOR(pg_catalog.-) NEW.%1$I;
        END IF;
    ELSIF TG_OP OPERATOR(pg_catalog.=) 'INSERT' THEN
        tok := NEW.%1$I;
    END IF;
    IF tok IS NULL THEN
        tok := (CASE WHEN pg_catalog.current_setting('fence.tokens', true) OPERATOR(pg_catalog.<>) '' THEN pg_catalog.current_setting('fence.tokens', true)::pg_catalog.jsonb END OPERATOR(pg_catalog.->>) res)::pg_catalog.int8;
    END IF;
$s$
        ELSE
$s$
    res := TG_ARGV[0];
    tok := (CASE WHEN pg_catalog.current_setting('fence.tokens', true) OPERATOR(pg_catalog.<>) '' THEN pg_catalog.current_setting('fence.tokens', true)::pg_catalog.jsonb END OPERATOR(pg_catalog.->>) res)::pg_catalog.int8;
$s$
        END,
$s$
    IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed' THEN
        BEGIN  -- a subtransaction of its own, as in fence._check
            ok := pg_catalog.pg_try_advisory_xact_lock_shared(fence._gate_key(res));
        EXCEPTION WHEN OTHERS THEN
            RAISE;
        END;
        IF ok THEN
            SELECT x.token OPERATOR(pg_catalog.=) tok AND CURRENT_USER OPERATOR(pg_catalog.=) fence._acting_role()
              INTO ok FROM fence.lease x WHERE x.resource OPERATOR(pg_catalog.=) res;
        END IF;
    END IF;
$s$,
        CASE WHEN col IS NOT NULL THEN
$s$
    IF ok IS NOT TRUE OR (TG_OP OPERATOR(pg_catalog.=) 'UPDATE' AND OLD.%1$I OPERATOR(pg_catalog.>) tok) THEN
        tok := fence._guard_slow(res, tok, OLD.%1$I, TG_OP, TG_RELID);
    END IF;
    IF TG_OP OPERATOR(pg_catalog.=) 'DELETE' THEN
        RETURN OLD;
    END IF;
    NEW.%1$I := tok;
    RETURN NEW;
END
$s$
        ELSE
$s$
    IF ok IS NOT TRUE THEN
        PERFORM fence._guard_slow(res, tok, NULL, TG_OP, TG_RELID);
    END IF;
    IF TG_OP OPERATOR(pg_catalog.=) 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END
$s$
        END), col)
$f$;

-- As in 007, with two changes: the mark trigger leaves a foreign-key
-- action's assignment of the row's own value unmarked (no presentation, as
-- in fence._guard_source), and a refusal is counted (fence._refuse, through
-- fence._registered_token and fence._check_many).
CREATE OR REPLACE FUNCTION fence._rows_source(rcol name, tcol name) RETURNS text
LANGUAGE sql IMMUTABLE
AS $f$
    SELECT pg_catalog.format(pg_catalog.concat(
$s$
#variable_conflict use_variable
DECLARE
    pre pg_catalog.text;
    res pg_catalog.text;
    tok pg_catalog.int8;
    reg pg_catalog.text;
    regj pg_catalog.jsonb;
    rs pg_catalog.text[];
    ts pg_catalog.int8[];
    n pg_catalog.int4;
    held pg_catalog.int4;
    found_n pg_catalog.int8;
    stale pg_catalog.bool;
    kids pg_catalog.bool;
BEGIN
$s$,
        CASE WHEN tcol IS NOT NULL THEN
$s$
    IF TG_NAME OPERATOR(pg_catalog.=) '~fence_guard_0_mark' THEN
        -- A foreign-key action's assignment of the row's own value is
        -- not a presentation (as in fence._guard_source).
        IF NEW.%2$I OPERATOR(pg_catalog.=) OLD.%2$I AND pg_catalog.pg_trigger_depth() OPERATOR(pg_catalog.>) 1 THEN
            RETURN NEW;
        END IF;
        IF NEW.%2$I OPERATOR(pg_catalog.<=) 0 THEN
            PERFORM fence.check((TG_ARGV[0] OPERATOR(pg_catalog.||) NEW.%1$I::pg_catalog.text) COLLATE pg_catalog."C", NEW.%2$I);
        END IF;
        NEW.%2$I := OPERATOR(pg_catalog.-) NEW.%2$I;
        RETURN NEW;
    END IF;
    IF TG_LEVEL OPERATOR(pg_catalog.=) 'ROW' THEN
        IF TG_OP OPERATOR(pg_catalog.=) 'UPDATE' AND NEW.%2$I OPERATOR(pg_catalog.<) 0
           AND (OLD.%2$I IS NULL OR NEW.%2$I OPERATOR(pg_catalog.<>) OLD.%2$I) THEN
            NEW.%2$I := OPERATOR(pg_catalog.-) NEW.%2$I;
            RETURN NEW;
        END IF;
        IF TG_OP OPERATOR(pg_catalog.=) 'INSERT' AND NEW.%2$I IS NOT NULL THEN
            RETURN NEW;
        END IF;
        res := (TG_ARGV[0] OPERATOR(pg_catalog.||) NEW.%1$I::pg_catalog.text) COLLATE pg_catalog."C";
        reg := pg_catalog.current_setting('fence.tokens', true);
        IF reg OPERATOR(pg_catalog.<>) '' THEN
            tok := (reg::pg_catalog.jsonb OPERATOR(pg_catalog.->>) res)::pg_catalog.int8;
        END IF;
        IF tok IS NULL THEN
            tok := fence._registered_token(res, TG_OP, TG_RELID);
        END IF;
        NEW.%2$I := tok;
        RETURN NEW;
    END IF;
$s$
        END,
$s$
    pre := TG_ARGV[0];
    IF CURRENT_USER OPERATOR(pg_catalog.<>) fence._acting_role() THEN
        PERFORM fence._acting_role_check(TG_RELID);
    END IF;
    regj := CASE WHEN pg_catalog.current_setting('fence.tokens', true) OPERATOR(pg_catalog.<>) ''
                 THEN pg_catalog.current_setting('fence.tokens', true)::pg_catalog.jsonb END;
    -- One query: the distinct (resource, token) pairs the statement wrote,
    -- their number, and whether the table has inheritance children (their
    -- rows pass this table's statement triggers but not its row triggers).
    IF TG_OP OPERATOR(pg_catalog.=) 'UPDATE' THEN
$s$,
        CASE WHEN tcol IS NOT NULL THEN
$s$
        SELECT pg_catalog.array_agg(q.r), pg_catalog.array_agg(q.t), pg_catalog.count(*),
               EXISTS (SELECT FROM pg_catalog.pg_inherits i WHERE i.inhparent OPERATOR(pg_catalog.=) TG_RELID)
          INTO rs, ts, n, kids FROM (
            SELECT DISTINCT (pre OPERATOR(pg_catalog.||) n.%1$I::pg_catalog.text) COLLATE pg_catalog."C" AS r, n.%2$I AS t FROM fence_new n
            UNION ALL
            SELECT g.r, (regj OPERATOR(pg_catalog.->>) g.r)::pg_catalog.int8 FROM (
                SELECT DISTINCT (pre OPERATOR(pg_catalog.||) o.%1$I::pg_catalog.text) COLLATE pg_catalog."C" AS r FROM fence_old o) g
             WHERE NOT EXISTS (SELECT FROM fence_new n
                                WHERE (pre OPERATOR(pg_catalog.||) n.%1$I::pg_catalog.text) COLLATE pg_catalog."C" OPERATOR(pg_catalog.=) g.r)) q;
$s$
        ELSE
$s$
        SELECT pg_catalog.array_agg(q.r), pg_catalog.array_agg((regj OPERATOR(pg_catalog.->>) q.r)::pg_catalog.int8), pg_catalog.count(*),
               EXISTS (SELECT FROM pg_catalog.pg_inherits i WHERE i.inhparent OPERATOR(pg_catalog.=) TG_RELID)
          INTO rs, ts, n, kids FROM (
            SELECT (pre OPERATOR(pg_catalog.||) n.%1$I::pg_catalog.text) COLLATE pg_catalog."C" AS r FROM fence_new n
            UNION
            SELECT (pre OPERATOR(pg_catalog.||) o.%1$I::pg_catalog.text) COLLATE pg_catalog."C" FROM fence_old o) q;
$s$
        END,
$s$
    ELSIF TG_OP OPERATOR(pg_catalog.=) 'INSERT' THEN
        SELECT pg_catalog.array_agg(q.r), pg_catalog.array_agg(q.t), pg_catalog.count(*),
               EXISTS (SELECT FROM pg_catalog.pg_inherits i WHERE i.inhparent OPERATOR(pg_catalog.=) TG_RELID)
          INTO rs, ts, n, kids FROM (
            SELECT DISTINCT (pre OPERATOR(pg_catalog.||) n.%1$I::pg_catalog.text) COLLATE pg_catalog."C" AS r, $s$,
        CASE WHEN tcol IS NOT NULL THEN 'n.%2$I'
             ELSE $s$(regj OPERATOR(pg_catalog.->>) ((pre OPERATOR(pg_catalog.||) n.%1$I::pg_catalog.text) COLLATE pg_catalog."C"))::pg_catalog.int8$s$ END,
$s$ AS t FROM fence_new n) q;
    ELSE
        SELECT pg_catalog.array_agg(q.r), pg_catalog.array_agg((regj OPERATOR(pg_catalog.->>) q.r)::pg_catalog.int8), pg_catalog.count(*),
               EXISTS (SELECT FROM pg_catalog.pg_inherits i WHERE i.inhparent OPERATOR(pg_catalog.=) TG_RELID)
          INTO rs, ts, n, kids FROM (
            SELECT DISTINCT (pre OPERATOR(pg_catalog.||) o.%1$I::pg_catalog.text) COLLATE pg_catalog."C" AS r FROM fence_old o) q;
    END IF;
    IF kids THEN
        RAISE EXCEPTION 'pgfence: per-row protected table %% has inheritance children', TG_RELID::pg_catalog.regclass
            USING ERRCODE = '42809',
                  HINT = 'the guard does not see the children''s rows as they are written: drop the children (or ALTER TABLE ... NO INHERIT), or fence.unprotect the table';
    END IF;
    IF n OPERATOR(pg_catalog.=) 0 THEN
        RETURN NULL;
    END IF;
    -- A statement over a few resources takes their gates in share mode (in
    -- key order), while the transaction holds at most 64 (counted in
    -- fence._gates; a forged count only moves statements to the row locks):
    -- a waiting grant then queues new writers behind it, and under READ
    -- COMMITTED the gates are the whole check (a read after them sees every
    -- grant that committed before, and none can commit until we end).
    -- Everything else, and every failure (for its error), goes to
    -- fence._check_many, which locks the lease rows. docs/design.md,
    -- "Per-row resources" (the lock budget, fairness).
    held := CASE WHEN n OPERATOR(pg_catalog.>) 16 OR pg_catalog.array_position(rs, NULL) IS NOT NULL THEN 64
                 WHEN pg_catalog.current_setting('fence._gates', true) OPERATOR(pg_catalog.~) '^[0-9]{1,4}$'
                 THEN pg_catalog.current_setting('fence._gates', true)::pg_catalog.int4
                 WHEN COALESCE(pg_catalog.current_setting('fence._gates', true), '') OPERATOR(pg_catalog.=) '' THEN 0
                 ELSE 64 END;
    IF held OPERATOR(pg_catalog.+) n OPERATOR(pg_catalog.<=) 64 THEN
        IF n OPERATOR(pg_catalog.=) 1 THEN
            -- one resource (most statements): its gate, then a plain read by
            -- key under READ COMMITTED (a void cast to text is '')
            BEGIN  -- a subtransaction of its own, as in fence._check
                reg := pg_catalog.set_config('fence._gates', (held OPERATOR(pg_catalog.+) 1)::pg_catalog.text, true)
                       OPERATOR(pg_catalog.||) pg_catalog.pg_advisory_xact_lock_shared(fence._gate_key(rs[1]))::pg_catalog.text;
            EXCEPTION WHEN OTHERS THEN
                RAISE;
            END;
            SELECT x.token OPERATOR(pg_catalog.<>) ts[1]
                   OR pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed'
              INTO stale FROM fence.lease x WHERE x.resource OPERATOR(pg_catalog.=) rs[1];
            IF stale IS FALSE THEN
                RETURN NULL;
            END IF;
        ELSE
            BEGIN  -- a subtransaction of its own, as in fence._check
                PERFORM pg_catalog.pg_advisory_xact_lock_shared(g.k)
                   FROM (SELECT DISTINCT fence._gate_key(u.r) AS k FROM pg_catalog.unnest(rs) AS u(r)) g ORDER BY g.k;
            EXCEPTION WHEN OTHERS THEN
                RAISE;
            END;
            reg := pg_catalog.set_config('fence._gates', (held OPERATOR(pg_catalog.+) n)::pg_catalog.text, true);
            IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed' THEN
                SELECT pg_catalog.count(*), pg_catalog.bool_or(u.t IS NULL OR u.t OPERATOR(pg_catalog.<>) l.token) INTO found_n, stale
                  FROM ROWS FROM (pg_catalog.unnest(rs), pg_catalog.unnest(ts)) AS u(r, t),
                       LATERAL (SELECT x.token FROM fence.lease x WHERE x.resource OPERATOR(pg_catalog.=) u.r) l;
                IF found_n OPERATOR(pg_catalog.=) n AND NOT stale THEN
                    RETURN NULL;
                END IF;
            END IF;
        END IF;
    END IF;
    PERFORM fence._check_many(rs, ts, TG_OP, TG_RELID);
    RETURN NULL;
END
$s$), rcol, tcol)
$f$;


-- The guard functions already generated get the new bodies (they keep
-- their names, owner, grants and comments): every table protected before
-- this migration gets the new checks at once, whoever owns it.
DO $$
DECLARE
    g record;
BEGIN
    EXECUTE pg_catalog.format('CREATE OR REPLACE FUNCTION fence._guard_use_token() RETURNS trigger LANGUAGE plpgsql VOLATILE AS %L',
                              fence._guard_source(NULL));
    FOR g IN SELECT DISTINCT p.oid::pg_catalog.regprocedure AS fn,
                    CASE WHEN p.proname LIKE '\_rows\_%'
                         THEN fence._rows_source(fence._trigger_arg(t.tgargs, 2)::name, NULLIF(fence._trigger_arg(t.tgargs, 1), '')::name)
                         ELSE fence._guard_source(fence._trigger_arg(t.tgargs, 1)::name) END AS src
               FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_trigger t ON t.tgfoid = p.oid
              WHERE p.pronamespace = 'fence'::pg_catalog.regnamespace AND p.proname ~ '^_(guard|rows)_[0-9a-f]{32}$' LOOP
        EXECUTE pg_catalog.format('CREATE OR REPLACE FUNCTION %s RETURNS trigger LANGUAGE plpgsql VOLATILE AS %L', g.fn, g.src);
    END LOOP;
END
$$;

-- As in 007, but a guard trigger set to fire in replica mode only (ALTER
-- TABLE ... ENABLE REPLICA TRIGGER) no longer counts as enabled: ordinary
-- sessions skip it, as they skip a disabled one
-- (TestDoctorReportsGuardsThatFireInReplicaModeOnly).
CREATE OR REPLACE VIEW fence.protected AS
SELECT t.tgrelid::regclass AS tbl,
       fence._trigger_arg(t.tgargs, 0) AS resource,
       (CASE WHEN pg_catalog.bool_or(t.tgname = '~fence_rows_2_upd')
             THEN NULLIF(max(fence._trigger_arg(t.tgargs, 1)) FILTER (WHERE t.tgname = '~fence_rows_2_upd'), '')
             ELSE max(fence._trigger_arg(t.tgargs, 1)) FILTER (WHERE t.tgname IN ('zz_fence_guard_row', '~fence_guard_1_row')) END)::name AS token_column,
       (SELECT pg_catalog.array_agg(r.rolname ORDER BY r.rolname)
          FROM pg_catalog.pg_roles r, pg_catalog.pg_class c
         WHERE c.oid = t.tgrelid
           AND NOT r.rolsuper
           AND NOT pg_catalog.pg_has_role(r.oid, c.relowner, 'USAGE')
           AND pg_catalog.has_table_privilege(r.oid, t.tgrelid, 'TRIGGER')) AS trigger_roles,
       CASE WHEN pg_catalog.bool_or(t.tgname = '~fence_rows_2_upd') THEN 'rows' ELSE 'table' END AS form,
       (max(fence._trigger_arg(t.tgargs, 2)) FILTER (WHERE t.tgname = '~fence_rows_2_upd'))::name AS resource_column,
       (SELECT pg_catalog.bool_and(g.tgenabled = 'A') FROM pg_catalog.pg_trigger g JOIN pg_catalog.pg_proc p ON p.oid = g.tgfoid
         WHERE g.tgrelid = t.tgrelid AND p.pronamespace = 'fence'::pg_catalog.regnamespace AND NOT g.tgisinternal) AS fires_always,
       (SELECT pg_catalog.bool_and(g.tgenabled IN ('O', 'A')) FROM pg_catalog.pg_trigger g JOIN pg_catalog.pg_proc p ON p.oid = g.tgfoid
         WHERE g.tgrelid = t.tgrelid AND p.pronamespace = 'fence'::pg_catalog.regnamespace AND NOT g.tgisinternal) AS enabled
  FROM pg_catalog.pg_trigger t
 WHERE t.tgname IN ('zz_fence_guard_row', '~fence_guard_1_row', 'zz_fence_guard_stmt', '~fence_rows_2_upd')
   AND t.tgfoid IN (SELECT p.oid FROM pg_catalog.pg_proc p WHERE p.pronamespace = 'fence'::pg_catalog.regnamespace)
 GROUP BY t.tgrelid, fence._trigger_arg(t.tgargs, 0);
COMMENT ON VIEW fence.protected IS
    'every table guarded by fence.protect (form table: resource) or fence.protect_rows (form rows: resource is the prefix, resource_column names the rest), its token column (NULL: fence.use_token), the roles other than the owner that can create triggers on it, whether its guards fire in replica mode too (fires_always) and whether every guard fires for ordinary sessions, none disabled or set to fire in replica mode only (enabled)';

-- As in 007, and the refusals: fence.refusals to read, fence._refuse for
-- the guards' failing paths.
CREATE OR REPLACE FUNCTION fence.grant_usage(role name, operator boolean DEFAULT false) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    fn regprocedure;
BEGIN
    IF role IS NULL THEN
        RAISE EXCEPTION 'pgfence: role must not be NULL' USING ERRCODE = '22004', HINT = 'pass the name of the application role';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = role) THEN
        RAISE EXCEPTION 'pgfence: role % does not exist', role USING ERRCODE = '42704', HINT = 'create the role first (CREATE ROLE)';
    END IF;
    EXECUTE format('GRANT USAGE ON SCHEMA fence TO %I', role);
    EXECUTE format('GRANT SELECT ON fence.leases, fence.protected, fence.lease, fence.refusals TO %I', role);
    EXECUTE format('GRANT EXECUTE ON FUNCTION fence.acquire(text, text, interval, boolean), fence.acquire_session(text, text),
        fence.renew(text, bigint, interval), fence.release(text, bigint), fence.check(text, bigint),
        fence.use_token(text, bigint), fence.protect(regclass, text, name), fence.unprotect(regclass),
        fence.protect_rows(regclass, name, text, name),
        fence._guard_row(), fence._guard_stmt(), fence._guard_use_token(), fence._rows_truncate(),
        fence._registered_token(text, text, oid), fence._check_many(text[], bigint[], text, oid),
        fence._check_name(text, text), fence._lease_key(text, bigint), fence._gate_key(text), fence._trigger_arg(bytea, integer),
        fence._guard_function(regclass, name), fence._rows_function(regclass, name, name),
        fence._acting_role(), fence._acting_role_check(oid), fence._refuse(text, text, text, text), fence._guard_slow(text, bigint, bigint, text, oid), fence.fire_always(regclass, boolean), fence._pin_condition(name, name), fence._token_floor(), fence._guard_triggers(regclass),
        fence._owned_table(regclass, text), fence._protectable(regclass), fence._check_token_column(regclass, text, name),
        fence._floor_from_column(regclass, text, name), fence._drop_guards(regclass, text),
        fence.lock_key(text), fence.try_lock(text), fence.unlock(text),
        fence.try_xact_lock(text), fence.version() TO %I', role);
    FOR fn IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
               WHERE p.pronamespace = 'fence'::pg_catalog.regnamespace AND p.proname ~ '^_(guard|rows)_[0-9a-f]{32}$' LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', fn, role);
    END LOOP;
    IF operator THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION fence.revoke(text), fence._raise_floor(bigint) TO %I', role);
    END IF;
END
$$;


CREATE OR REPLACE FUNCTION fence.version() RETURNS integer
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT 8 $$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA fence FROM PUBLIC;
-- Roles granted usage before this migration get what is new: fence.refusals,
-- fence._refuse and fence._guard_slow.
SELECT fence._regrant_usage();
