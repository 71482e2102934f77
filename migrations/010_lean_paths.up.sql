-- pgfence 010: lean paths (issue 29: the four instruction targets that 009
-- missed). Nothing a write or a grant must prove changes, and no table,
-- trigger or generated guard is touched: kit functions prove the same with
-- fewer instructions (docs/benchmarks.md, "Migration 010").
--
-- 1. The per-row guard: fence._lock_check, called once a row, is no longer
--    pinned to a search_path (it qualifies every name), and
--    fence._rows_kids reads the children without a subquery.
-- 2. The grant: fence.acquire's fast path (009 section 6) finds the row it
--    locked by its ctid; fence.acquire and fence.release are no longer
--    pinned to a search_path either, and fence.release runs fewer
--    statements.
-- 3. fence.grant_usage includes fence._guard_maker, without which
--    fence.allow_producers failed for a table owner that is not the kit's.

-- ---------------------------------------------------------------------------
-- 1. The per-row guard
-- ---------------------------------------------------------------------------

-- As in 009 (it locks the lease row of res FOR KEY SHARE and says whether
-- tok is its token), no longer pinned to a search_path: unlike every other
-- SECURITY DEFINER function of the kit but fence.acquire and fence.release
-- (section 2). The per-row guard calls it once a row, and the pin cost each
-- call 13.5 k instructions (the shared tool's per-row UPDATE: 253.1 k with
-- it, 239.6 k without).
-- Why it is safe without the pin: its query is planned with the caller's
-- search_path, so nothing in it may be looked up there. Every relation,
-- type and operator it names is schema-qualified (fence.lease,
-- pg_catalog.bool, OPERATOR(pg_catalog.=)); it calls no function; no
-- construct that looks an operator up by name (IN, BETWEEN, NULLIF, IS
-- DISTINCT FROM, a simple CASE) appears; its argument types are fixed by
-- its signature; pg_temp is searched for relations and types only, and it
-- names none without a schema. A caller's schema before pg_catalog with a
-- twin of every pg_catalog operator between the kit's types changes
-- nothing and none of the twins runs (sqlfuncs
-- TestRowGuardIgnoresAHostileSearchPath).
CREATE OR REPLACE FUNCTION fence._lock_check(res text, tok bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    ok pg_catalog.bool;
BEGIN
    SELECT x.token OPERATOR(pg_catalog.=) tok INTO ok FROM fence.lease x WHERE x.resource OPERATOR(pg_catalog.=) res FOR KEY SHARE;
    RETURN ok;
END
$$;

-- As in 009, with the children read by a PERFORM and FOUND instead of IF
-- EXISTS (a subquery, whose plan starts two nodes): 4.6 k instructions a
-- statement (the shared tool's per-row UPDATE 239.6 k to 235.0 k, its
-- DELETE 333.5 k to 329.3 k).
CREATE OR REPLACE FUNCTION fence._rows_kids() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM FROM pg_catalog.pg_inherits i WHERE i.inhparent OPERATOR(pg_catalog.=) TG_RELID;
    IF FOUND THEN
        RAISE EXCEPTION 'pgfence: per-row protected table % has inheritance children', TG_RELID::pg_catalog.regclass
            USING ERRCODE = '42809',
                  HINT = 'the guard does not see the children''s rows as they are written: drop the children (or ALTER TABLE ... NO INHERIT), or fence.unprotect the table';
    END IF;
    RETURN NULL;
END
$$;

-- ---------------------------------------------------------------------------
-- 2. The grant
-- ---------------------------------------------------------------------------

-- fence.acquire and fence.release are no longer pinned to a search_path:
-- a pinned search_path costs a SECURITY DEFINER call about 7 k instructions
-- on the way in and again on the way out (the shared tool's grant scenario,
-- one acquire and one release, 24.6 k less with both pins taken out), and
-- these are the two calls every lease makes. Why they are safe without it
-- is the argument of fence._lock_check (section 1): nothing on their paths
-- is looked up by name. Every relation, type, function and operator they
-- name is schema-qualified, and so is every SQL function they inline
-- (fence._name_ok, fence._ttl_ok, fence._live and fence._timeline below get
-- qualified bodies with the same meaning; fence._cache_epoch,
-- fence._force_durable, fence._gate_key, fence._lease_key and
-- fence._notify_free were already). What they call that is not qualified
-- now pins search_path itself: fence._grant (every fall-back),
-- fence._session_alive (the liveness of a session lease),
-- fence._check_name, fence._check_ttl and fence._check_token (the errors).
-- sqlfuncs TestGrantIgnoresAHostileSearchPath runs every path with a
-- caller's schema before pg_catalog whose operators for the kit's types
-- raise an error if they ever run.

CREATE OR REPLACE FUNCTION fence._name_ok(v text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT pg_catalog.char_length(v) OPERATOR(pg_catalog.>=) 1 AND pg_catalog.char_length(v) OPERATOR(pg_catalog.<=) 255 $$;

CREATE OR REPLACE FUNCTION fence._ttl_ok(secs double precision) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT secs OPERATOR(pg_catalog.>=) 0.01 AND secs OPERATOR(pg_catalog.<=) 86400 $$;

CREATE OR REPLACE FUNCTION fence._live(l fence.lease, now timestamptz) RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    SELECT l.ended_at IS NULL
       AND CASE WHEN l.kind OPERATOR(pg_catalog.=) 'ttl' THEN l.expires_at OPERATOR(pg_catalog.>) now
                WHEN l.kind OPERATOR(pg_catalog.=) 'session' THEN fence._session_alive(l)
                ELSE false END
$$;

CREATE OR REPLACE FUNCTION fence._timeline() RETURNS bigint
LANGUAGE sql VOLATILE
AS $$
    SELECT ('x' OPERATOR(pg_catalog.||) pg_catalog.lpad(pg_catalog.substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8), 16, '0'))::bit(64)::bigint
$$;

ALTER FUNCTION fence._grant(text, text, text, interval, boolean, boolean) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION fence._session_alive(fence.lease) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION fence._check_name(text, text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION fence._check_ttl(interval) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION fence._check_token(bigint) SET search_path = pg_catalog, pg_temp;

-- As in 009, unpinned and qualified, with the lease row found by its ctid
-- after the unlocked read: the InitPlan locks the version the read saw (a
-- TID scan, its resource compared again, since a pruned TID can hold
-- another row later), and the UPDATE writes the version the InitPlan
-- locked (a TID scan too), where 009 scanned fence.lease_pkey twice more
-- (the shared tool's grant scenario, seeded: 495 k to 481 k for the
-- UPDATE's scan, 445 k to 434 k for the InitPlan's). When the version the
-- read saw is no longer the newest (a release, renewal or grant committed
-- in between) or the newest is not visible to the UPDATE's snapshot, the
-- TID scans find nothing, the UPDATE writes nothing, and the grant falls
-- back to fence._grant, which waits and re-reads as before; a row locked
-- by someone else is skipped (SKIP LOCKED) with the same result.
CREATE OR REPLACE FUNCTION fence.acquire(resource text, holder text, ttl interval, waiting boolean DEFAULT false) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
#variable_conflict use_variable
DECLARE
    secs    double precision := pg_catalog.date_part('epoch', ttl);
    r       record;
    gate    boolean;
    now     pg_catalog.timestamptz;
    t       bigint;
    durable pg_catalog.text;  -- assigned, not PERFORMed: see fence._force_durable
BEGIN
    IF fence._name_ok(resource) AND fence._name_ok(holder) AND fence._ttl_ok(secs) THEN
        SELECT fence._cache_epoch(c) AS epoch, fence._live(x, pg_catalog.clock_timestamp()) AS live, x.waiters, x.ctid AS at INTO r
          FROM fence.epoch_cache c JOIN fence.lease x ON x.resource OPERATOR(pg_catalog.=) resource;
        IF r.live AND (NOT coalesce(waiting, false) OR r.waiters) THEN
            RETURN NULL;  -- live: busy at once, without a lock, as in fence._grant
        END IF;
        IF r.epoch IS NOT NULL AND NOT r.live THEN
            durable := fence._force_durable();
            BEGIN  -- a subtransaction of its own, as every gate
                gate := pg_catalog.pg_try_advisory_xact_lock(fence._gate_key(resource));
            EXCEPTION WHEN OTHERS THEN
                RAISE;
            END;
            IF gate THEN
                now := pg_catalog.clock_timestamp();
                -- nextval only for the row it is written to (no counter
                -- value spent on a fall-back); the next value is above the
                -- last one, so the WHERE's bound is the written token's.
                UPDATE fence.lease x
                   SET token = (r.epoch OPERATOR(pg_catalog.<<) 43) OPERATOR(pg_catalog.|) pg_catalog.nextval('fence.token_counter'::pg_catalog.regclass),
                       holder = holder, kind = 'ttl', acquired_at = now,
                       expires_at = now OPERATOR(pg_catalog.+) pg_catalog.make_interval(secs => secs), ended_at = NULL,
                       session_pid = NULL, waiters = false
                 WHERE x.ctid OPERATOR(pg_catalog.=) (SELECT y.ctid FROM fence.lease y WHERE y.ctid OPERATOR(pg_catalog.=) r.at AND y.resource OPERATOR(pg_catalog.=) resource FOR UPDATE SKIP LOCKED)
                   AND x.token OPERATOR(pg_catalog.<) ((r.epoch OPERATOR(pg_catalog.<<) 43) OPERATOR(pg_catalog.|)
                                                      (pg_catalog.pg_sequence_last_value('fence.token_counter'::pg_catalog.regclass) OPERATOR(pg_catalog.+) 1))
                   AND NOT fence._live(x, now)
                RETURNING x.token INTO t;
                IF (t OPERATOR(pg_catalog.>>) 43) OPERATOR(pg_catalog.=) r.epoch THEN
                    RETURN t;
                ELSIF t IS NOT NULL THEN
                    -- the counter ran past 2^43 - 1 into the epoch's bits:
                    -- refused as fence._next_token refuses it (the update
                    -- goes with the error)
                    RAISE EXCEPTION 'pgfence: the token counter is exhausted in epoch %', r.epoch
                        USING ERRCODE = '54000', HINT = 'the token layout allows 2^43 - 1 grants per epoch across all resources; see docs/design.md';
                END IF;
            END IF;
        END IF;
        RETURN fence._grant(resource, holder, 'ttl', pg_catalog.make_interval(secs => secs), false, coalesce(waiting, false));
    END IF;
    PERFORM fence._check_name('resource', resource);
    PERFORM fence._check_name('holder', holder);
    RETURN fence._grant(resource, holder, 'ttl', fence._check_ttl(ttl), false, coalesce(waiting, false));
END
$$;

-- As in 002, unpinned and qualified, in fewer statements: the clock read
-- in the UPDATE, and one test of what the released row needs done after
-- (a session lock of this session to unlock, waiters to wake) instead of
-- three (the shared tool's grant scenario, seeded: 4.7 k less).
CREATE OR REPLACE FUNCTION fence.release(resource text, token bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
#variable_conflict use_variable
DECLARE
    k    pg_catalog.text;
    spid integer;
    w    boolean;
    more boolean;
BEGIN
    IF (fence._name_ok(resource) AND token OPERATOR(pg_catalog.>) 0) IS NOT TRUE THEN
        PERFORM fence._check_name('resource', resource);
        PERFORM fence._check_token(token);
    END IF;
    UPDATE fence.lease x SET ended_at = pg_catalog.clock_timestamp()
     WHERE x.resource OPERATOR(pg_catalog.=) resource AND x.token OPERATOR(pg_catalog.=) token
       AND fence._live(x, pg_catalog.clock_timestamp())
    RETURNING x.kind, x.session_pid, x.waiters, x.waiters OR x.kind OPERATOR(pg_catalog.=) 'session' INTO k, spid, w, more;
    IF more THEN
        IF k OPERATOR(pg_catalog.=) 'session' AND spid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid() THEN
            PERFORM pg_catalog.pg_advisory_unlock(fence._lease_key(resource, token));
        END IF;
        IF w THEN
            PERFORM fence._notify_free(resource);
        END IF;
    END IF;
    RETURN k IS NOT NULL;
END
$$;

-- ---------------------------------------------------------------------------
-- 3. Usage
-- ---------------------------------------------------------------------------

-- As in 009, with fence._guard_maker: fence.allow_producers (009) calls that
-- owner check with the caller's rights, and a table owner with usage that
-- is not the kit's owner got "permission denied for function _guard_maker"
-- (sqlfuncs TestProducersOnATableOfAnotherOwner).
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
        fence._owned_table(regclass, text), fence._guard_maker(regclass), fence._protectable(regclass), fence._check_token_column(regclass, text, name),
        fence._floor_from_column(regclass, text, name), fence._drop_guards(regclass, text),
        fence._lock_check(text, bigint), fence._rows_slow(text, bigint, text, oid, boolean, boolean), fence._rows_kids(),
        fence._rows9_source(name, name), fence._rows9_mark_source(name, name), fence._rows9_function(regclass, name, name),
        fence._rows9_triggers(regclass, text, regprocedure, name, text, name, boolean), fence.allow_producers(regclass, boolean),
        fence.lock_key(text), fence.try_lock(text), fence.unlock(text),
        fence.try_xact_lock(text), fence.version(), fence.token_budget() TO %I', role);
    FOR fn IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
               WHERE p.pronamespace = 'fence'::pg_catalog.regnamespace AND p.proname ~ '^_(guard|rows)_[0-9a-f]{32}$' LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', fn, role);
    END LOOP;
    IF operator THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION fence.revoke(text), fence._raise_floor(bigint) TO %I', role);
    END IF;
END
$$;
COMMENT ON FUNCTION fence.grant_usage(name,boolean) IS 'grants role the use of the kit (leases, guards, advisory helpers); with operator => true also fence.revoke';

-- ---------------------------------------------------------------------------
-- 4. Version
-- ---------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION fence.version() RETURNS integer
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT 10 $$;

SELECT fence._regrant_usage();
