-- pgfence 003 down: back to the functions, view and triggers of 002. The
-- bodies below are those of 002_fast_paths.up.sql and 001_init.up.sql,
-- unchanged (read the comments there).
--
-- Refuses while leases exist, unless the session sets fence.allow_downgrade
-- to on: the lease rows hold every resource's latest token, and below this
-- version a further migrate down to 0 drops them, after which tokens start
-- again from the first one and a stale holder's token could be granted again
-- (docs/sql.md, "Removing the kit"). Refuses also while a protected table has
-- an owner this role is not a member of: its guard triggers could not be
-- put back in the 002 form.
DO $$
DECLARE
    tables text;
BEGIN
    IF EXISTS (SELECT 1 FROM fence.lease)
       AND coalesce(pg_catalog.current_setting('fence.allow_downgrade', true), '') <> 'on' THEN
        RAISE EXCEPTION 'pgfence: refusing to migrate below version 3 while leases exist'
            USING ERRCODE = '55000',
                  HINT = 'fence.lease keeps every resource''s latest token; migrating on down to 0 would forget them and let tokens be granted again. '
                         'To downgrade anyway, set fence.allow_downgrade = on in the migrating session (for example options=-c%20fence.allow_downgrade%3Don in the URL); '
                         'golang-migrate marks the version dirty after this failure: force it back to 3 first (pgfence migrate force 3)';
    END IF;
    SELECT pg_catalog.string_agg(p.tbl::text, ', ') INTO tables
      FROM fence.protected p JOIN pg_catalog.pg_class c ON c.oid = p.tbl::oid
     WHERE NOT pg_catalog.pg_has_role(current_user, c.relowner, 'USAGE');
    IF tables IS NOT NULL THEN
        RAISE EXCEPTION 'pgfence: cannot migrate below version 3: this role cannot re-create the guards of %', tables
            USING ERRCODE = '42501',
                  HINT = 'run the migration as the owner of those tables (or a member of their owners), or unprotect them first; '
                         'golang-migrate marks the version dirty after this failure: force it back to 3 first (pgfence migrate force 3)';
    END IF;
END
$$;

-- Guards of 002.
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

CREATE OR REPLACE FUNCTION fence._guard_stmt() RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM fence.check(TG_ARGV[0], fence._registered_token(TG_ARGV[0], TG_OP, format('%I.%I', TG_TABLE_SCHEMA, TG_TABLE_NAME)));
    RETURN NULL;
END
$$;

CREATE FUNCTION fence._registered_token(res text, op text, tbl text) RETURNS bigint
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

CREATE OR REPLACE FUNCTION fence.protect(tbl regclass, resource text, token_column name DEFAULT NULL) RETURNS void
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

CREATE OR REPLACE FUNCTION fence.unprotect(tbl regclass) RETURNS void
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

-- Every protected table gets its 002 triggers back (the loop reads the
-- view as it was before the loop changed any trigger).
DO $$
DECLARE
    p  record;
    tg name;
BEGIN
    FOR p IN SELECT v.tbl, v.resource, v.token_column FROM fence.protected v LOOP
        FOR tg IN SELECT fence._guard_triggers(p.tbl) LOOP
            EXECUTE pg_catalog.format('DROP TRIGGER %I ON %s', tg, p.tbl);
        END LOOP;
        PERFORM fence.protect(p.tbl, p.resource, p.token_column);
    END LOOP;
END
$$;

DO $$
DECLARE
    fn regprocedure;
BEGIN
    FOR fn IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
               WHERE p.pronamespace = 'fence'::pg_catalog.regnamespace AND p.proname ~ '^_guard_[0-9a-f]{32}$' LOOP
        EXECUTE pg_catalog.format('DROP FUNCTION %s', fn);
    END LOOP;
END
$$;
DROP FUNCTION fence._guard_use_token();
DROP FUNCTION fence._guard_function(name);
DROP FUNCTION fence._guard_source(name);
DROP FUNCTION fence._registered_token(text, text, oid);
DROP FUNCTION fence._guard_triggers(regclass);
DROP FUNCTION fence._owned_table(regclass, text);

-- Grants of 002.
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

CREATE OR REPLACE FUNCTION fence._durable() RETURNS trigger
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF pg_catalog.current_setting('synchronous_commit') = 'off' THEN
        PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION fence._epoch() RETURNS bigint
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

ALTER TABLE fence.lease ADD CONSTRAINT lease_token_key UNIQUE (resource, token);
DROP FUNCTION fence._next_token(bigint, bigint);
DROP FUNCTION fence._raise_floor(bigint);
DROP FUNCTION fence._token_floor();
DROP SEQUENCE fence.token_counter;

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

-- View and privileges of 001.
DROP VIEW fence.protected;
CREATE VIEW fence.protected AS
SELECT t.tgrelid::regclass AS tbl,
       fence._trigger_arg(t.tgargs, 0) AS resource,
       (max(fence._trigger_arg(t.tgargs, 1)) FILTER (WHERE t.tgname = 'zz_fence_guard_row'))::name AS token_column
  FROM pg_catalog.pg_trigger t
 WHERE t.tgfoid IN ('fence._guard_row()'::regprocedure, 'fence._guard_stmt()'::regprocedure)
 GROUP BY t.tgrelid, fence._trigger_arg(t.tgargs, 0);
COMMENT ON VIEW fence.protected IS 'every table guarded by fence.protect, with its resource and token column (NULL: fence.use_token)';

CREATE OR REPLACE FUNCTION fence.grant_usage(role name, operator boolean DEFAULT false) RETURNS void
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

CREATE OR REPLACE FUNCTION fence.version() RETURNS integer
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT 2 $$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA fence FROM PUBLIC;
REVOKE ALL ON fence.protected FROM PUBLIC;

-- Roles with the kit's usage get exactly what 002's fence.grant_usage gives.
DO $$
DECLARE
    r record;
BEGIN
    -- Only roles that hold the grant themselves: a member of a role with
    -- usage has it through membership, and must lose it with the membership.
    FOR r IN SELECT a.rolname,
                    EXISTS (SELECT 1 FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) x
                             WHERE p.oid = 'fence.revoke(text)'::pg_catalog.regprocedure
                               AND x.grantee = a.oid AND x.privilege_type = 'EXECUTE') AS op
               FROM pg_catalog.pg_roles a
              WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) x
                             WHERE p.oid = 'fence.use_token(text, bigint)'::pg_catalog.regprocedure
                               AND x.grantee = a.oid AND x.privilege_type = 'EXECUTE')
                AND NOT pg_catalog.pg_has_role(a.oid, (SELECT n.nspowner FROM pg_catalog.pg_namespace n WHERE n.nspname = 'fence'), 'USAGE')
                AND NOT a.rolsuper LOOP
        PERFORM fence.revoke_usage(r.rolname);
        PERFORM fence.grant_usage(r.rolname, r.op);
    END LOOP;
END
$$;
