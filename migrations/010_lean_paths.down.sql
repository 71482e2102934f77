-- pgfence 010 down: back to 009 exactly (each section puts back what the
-- same section of the up replaced).

-- ---------------------------------------------------------------------------
-- 4. Version
-- ---------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION fence.version() RETURNS integer
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT 9 $$;

-- ---------------------------------------------------------------------------
-- 3. Usage
-- ---------------------------------------------------------------------------

-- 009's fence.grant_usage, and fence._guard_maker executable by its owner
-- only again.
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

DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT x.grantee::pg_catalog.regrole AS role FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) x
              WHERE p.oid = 'fence._guard_maker(regclass)'::pg_catalog.regprocedure AND x.grantee <> p.proowner AND x.grantee <> 0 LOOP
        EXECUTE pg_catalog.format('REVOKE EXECUTE ON FUNCTION fence._guard_maker(regclass) FROM %s', r.role);
    END LOOP;
END
$$;

-- ---------------------------------------------------------------------------
-- 2. The grant
-- ---------------------------------------------------------------------------

-- 009's fence.acquire and 002's fence.release (both pinned again).
CREATE OR REPLACE FUNCTION fence.acquire(resource text, holder text, ttl interval, waiting boolean DEFAULT false) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    secs    double precision := pg_catalog.date_part('epoch', ttl);
    r       record;
    gate    boolean;
    now     timestamptz;
    t       bigint;
    durable text;  -- assigned, not PERFORMed: see fence._force_durable
BEGIN
    IF fence._name_ok(resource) AND fence._name_ok(holder) AND fence._ttl_ok(secs) THEN
        SELECT fence._cache_epoch(c) AS epoch, fence._live(x, pg_catalog.clock_timestamp()) AS live, x.waiters INTO r
          FROM fence.epoch_cache c JOIN fence.lease x ON x.resource = resource;
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
                   SET token = (r.epoch << 43) | pg_catalog.nextval('fence.token_counter'), holder = holder, kind = 'ttl',
                       acquired_at = now, expires_at = now + pg_catalog.make_interval(secs => secs), ended_at = NULL,
                       session_pid = NULL, waiters = false
                 WHERE x.resource = (SELECT y.resource FROM fence.lease y WHERE y.resource = resource FOR UPDATE SKIP LOCKED)
                   AND x.token < ((r.epoch << 43) | (pg_catalog.pg_sequence_last_value('fence.token_counter') + 1))
                   AND NOT fence._live(x, now)
                RETURNING x.token INTO t;
                IF t >> 43 = r.epoch THEN
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

-- The helpers as 001 and 002 left them, without a pinned search_path.
ALTER FUNCTION fence._grant(text, text, text, interval, boolean, boolean) RESET search_path;
ALTER FUNCTION fence._session_alive(fence.lease) RESET search_path;
ALTER FUNCTION fence._check_name(text, text) RESET search_path;
ALTER FUNCTION fence._check_ttl(interval) RESET search_path;
ALTER FUNCTION fence._check_token(bigint) RESET search_path;

CREATE OR REPLACE FUNCTION fence._name_ok(v text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT pg_catalog.char_length(v) BETWEEN 1 AND 255 $$;

CREATE OR REPLACE FUNCTION fence._ttl_ok(secs double precision) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT secs BETWEEN 0.01 AND 86400 $$;

CREATE OR REPLACE FUNCTION fence._live(l fence.lease, now timestamptz) RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    SELECT l.ended_at IS NULL
       AND CASE l.kind WHEN 'ttl' THEN l.expires_at > now
                       WHEN 'session' THEN fence._session_alive(l)
                       ELSE false END
$$;

CREATE OR REPLACE FUNCTION fence._timeline() RETURNS bigint
LANGUAGE sql VOLATILE
AS $$
    SELECT ('x' || lpad(substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8), 16, '0'))::bit(64)::bigint
$$;

-- ---------------------------------------------------------------------------
-- 1. The per-row guard
-- ---------------------------------------------------------------------------

-- 009's fence._lock_check (pinned again) and fence._rows_kids.
CREATE OR REPLACE FUNCTION fence._lock_check(res text, tok bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ok boolean;
BEGIN
    SELECT x.token = tok INTO ok FROM fence.lease x WHERE x.resource = res FOR KEY SHARE;
    RETURN ok;
END
$$;

CREATE OR REPLACE FUNCTION fence._rows_kids() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_inherits i WHERE i.inhparent OPERATOR(pg_catalog.=) TG_RELID) THEN
        RAISE EXCEPTION 'pgfence: per-row protected table % has inheritance children', TG_RELID::pg_catalog.regclass
            USING ERRCODE = '42809',
                  HINT = 'the guard does not see the children''s rows as they are written: drop the children (or ALTER TABLE ... NO INHERIT), or fence.unprotect the table';
    END IF;
    RETURN NULL;
END
$$;
