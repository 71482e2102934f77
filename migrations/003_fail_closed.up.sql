-- pgfence 003: guards that fail closed, tokens unique across resources.
--
-- What changes (the reasons, and the proofs, are in docs/design.md, "Fail
-- closed"; the rule users see is in docs/sql.md, "Guards"):
--
-- * A write to a protected table presents a token in exactly two ways: by
--   assigning the token column in that statement, or by fence.use_token
--   earlier in the transaction. A write that presents neither fails with
--   FN002, whatever the row already carries. Guards are BEFORE row triggers,
--   generated per token-column name, that read the column directly.
-- * No per-transaction "checked" shortcut: every guarded row compares its
--   token with the resource's latest grant, so nothing can be forged into a
--   skip, and a grant made earlier in the same transaction is seen.
-- * Tokens come from one counter (fence.token_counter) shared by every
--   resource: no two resources are ever granted the same token.
-- * fence.protect makes every later grant exceed the tokens the table's rows
--   already carry (a re-install, a data-only restore).
-- * Code that runs under the caller's search_path qualifies every name and
--   operator, including what runs at COMMIT (fence._durable).
-- * fence.protected names the roles other than the owner that can create
--   triggers on a protected table.
--
-- Existing protected tables get the new guards here when the role running
-- the migration may re-create their triggers (it owns them, or is a member of
-- the owner); the others keep their triggers, whose function becomes the
-- fail-closed generic guard below (slower, and stricter: an UPDATE that
-- re-assigns the token the row already carries also needs fence.use_token)
-- until their owner runs fence.protect again. The migration says which in a
-- WARNING, and pgfence doctor reports them.

-- ---------------------------------------------------------------------------
-- Tokens: one counter for every resource
-- ---------------------------------------------------------------------------

-- The counter part of every token (token = epoch << 43 | counter). Shared by
-- all resources, so a token names one grant of one resource. A sequence is
-- safe here although nextval is not transactional: a grant commits with
-- synchronous_commit on (fence._durable), and that flush covers the WAL
-- record that advanced the sequence past the value used, so a crash never
-- hands a granted counter out again; values of rolled-back grants are
-- skipped, which is fine (tokens must grow, not be consecutive).
CREATE SEQUENCE fence.token_counter AS bigint MINVALUE 1 NO CYCLE;
COMMENT ON SEQUENCE fence.token_counter IS 'pgfence internal: the counter of every token (shared by all resources)';
-- Above every counter granted so far, in any epoch, so new tokens differ from
-- every token of any resource.
SELECT pg_catalog.setval('fence.token_counter',
                         greatest(coalesce((SELECT max(l.token OPERATOR(pg_catalog.&) 8796093022207) FROM fence.lease l), 0), 1),
                         EXISTS (SELECT 1 FROM fence.lease));

-- No unique constraint on (resource, token) any more. 001 said it was what
-- made fence.check exact under REPEATABLE READ (a grant had to be a key
-- update); it is not: every grant locks the row FOR UPDATE before it writes
-- the token, and that marks the old row version as key-updated all the same,
-- so a FOR KEY SHARE lock on it fails with 40001
-- (TestOlderSnapshotNeverPassesTheCheck, with and without the constraint;
-- docs/design.md, "Linearizable fencing"). Without the index a grant changes
-- no indexed column and can be a HOT update.
ALTER TABLE fence.lease DROP CONSTRAINT lease_token_key;

-- A data-only restore into a freshly migrated database must be able to
-- bring the source's fence.epoch_state row with it (so fence._epoch sees a
-- restored copy and moves to a new epoch); an empty install therefore keeps
-- no row, and the first grant creates it (fence._epoch, NOT FOUND).
DELETE FROM fence.epoch_state WHERE NOT EXISTS (SELECT 1 FROM fence.lease);

-- fence._epoch as in 001, except that a missing state row is created with
-- INSERT ... ON CONFLICT DO NOTHING and then read under a lock like any
-- other: an install keeps no row now (above), so concurrent first grants
-- can meet here, where 001 assumed the row always existed.
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
        IF NOT FOUND THEN
            -- First grant of this install, or of a restore that brought
            -- lease rows but no state: start past every stored token.
            INSERT INTO fence.epoch_state (system_identifier, relid, timeline, base)
            VALUES (sysid, myrel, tli, coalesce((SELECT max(l.token) >> 43 FROM fence.lease l), 0))
            ON CONFLICT DO NOTHING;
        END IF;
        SELECT * INTO s FROM fence.epoch_state FOR UPDATE;
        IF s.system_identifier = sysid AND s.relid = myrel AND s.timeline < tli THEN
            nbase := s.base;  -- promotion: the timeline alone moves the epoch up
            UPDATE fence.epoch_state SET timeline = tli;
        ELSIF s.system_identifier <> sysid OR s.relid <> myrel OR s.timeline > tli THEN
            -- a restored copy (another cluster or another database) or a
            -- timeline that went back: move past every epoch this data has seen
            nbase := greatest(s.base + s.timeline,
                              coalesce((SELECT max(l.token) >> 43 FROM fence.lease l), 0));
            UPDATE fence.epoch_state SET system_identifier = sysid, relid = myrel, timeline = tli, base = nbase;
        ELSE
            nbase := s.base;  -- just created, or another grant updated it while we waited
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

-- The next token of the current epoch, above `above` (the resource's latest
-- token). Normally one nextval. When `above` is not below it (the lease
-- rows came from a restore that fence._epoch did not recognise, or a floor
-- was raised), fence._raise_floor moves the epoch past `above` first.
CREATE FUNCTION fence._next_token(epoch bigint, above bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    c bigint := pg_catalog.nextval('fence.token_counter');
    t bigint;
BEGIN
    IF c OPERATOR(pg_catalog.>) 8796093022207 THEN
        RAISE EXCEPTION 'pgfence: the token counter is exhausted in epoch %', epoch
            USING ERRCODE = '54000', HINT = 'the token layout allows 2^43 - 1 grants per epoch across all resources; see docs/design.md';
    END IF;
    t := (epoch OPERATOR(pg_catalog.<<) 43) OPERATOR(pg_catalog.|) c;
    IF t OPERATOR(pg_catalog.<=) above THEN
        PERFORM fence._raise_floor(above);
        RETURN fence._next_token(fence._epoch(), above);
    END IF;
    RETURN t;
END
$$;

-- Makes every token granted from now on exceed `floor`: when floor is not
-- below the tokens the current epoch can still give (its epoch is the
-- current one and its counter is at or above the counter's last value, or
-- its epoch is later), the epoch base moves so that the current epoch is
-- floor's epoch + 1. Moving the base is transactional; it costs one epoch.
-- SECURITY DEFINER: it writes fence.epoch_state. Executable only by the
-- kit's owner and operators (fence.grant_usage(..., operator => true)),
-- because moving the epoch far up would exhaust the token space; fence.protect
-- calls it when a table carries such tokens (see fence._token_floor).
CREATE FUNCTION fence._raise_floor(floor bigint) RETURNS void
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
    UPDATE fence.epoch_state SET base = (floor >> 43) + 1 - s.timeline;
END
$$;

-- Every token granted from now on is greater than this value: the current
-- epoch with the counter's last value. (SECURITY DEFINER to read the
-- counter; it reveals no more than fence.leases does.)
CREATE FUNCTION fence._token_floor() RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT (fence._epoch() << 43) | (SELECT s.last_value - CASE WHEN s.is_called THEN 0 ELSE 1 END FROM fence.token_counter s)
$$;

-- fence._grant as in 002 (locking order, waits, durability: read the comment
-- in 001 and docs/design.md), with one change: the token is
-- fence._next_token (one counter for all resources) instead of the
-- resource's latest token + 1. The FOR UPDATE on the lease row is
-- load-bearing: besides ordering grants, it is what makes a REPEATABLE READ
-- check that predates this grant fail (see the constraint dropped above).
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

-- Runs at COMMIT (deferred constraint trigger) under whatever search_path
-- the caller left: pinned, so that no operator planted by the caller can
-- change the comparison (a planted "=" that answered false let a caller
-- commit a grant asynchronously).
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

-- ---------------------------------------------------------------------------
-- fence.check: no shortcut
-- ---------------------------------------------------------------------------

-- As in 002 without writing fence._checked: nothing skips a check any more.
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
        SELECT x.token INTO latest FROM fence.lease x WHERE x.resource = resource;
    ELSE
        SELECT x.token INTO latest FROM fence.lease x WHERE x.resource = resource FOR KEY SHARE;
    END IF;
    IF latest = token THEN
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
    ELSE
        RAISE EXCEPTION 'pgfence: unknown fencing token % for resource %: it was never granted', token, resource
            USING ERRCODE = 'FN003', DETAIL = format('resource=%s token=%s latest=%s', resource, token, latest),
                  HINT = 'use the token that fence.acquire returned for this resource';
    END IF;
END
$$;

-- ---------------------------------------------------------------------------
-- Guards
-- ---------------------------------------------------------------------------

-- The token fence.use_token registered for res in this transaction, or
-- FN002 naming the statement and table that needed it. rel is the table
-- (formatted only for the error). Runs under the writer's search_path:
-- every name and operator is qualified.
CREATE FUNCTION fence._registered_token(res text, op text, rel oid) RETURNS bigint
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
        RAISE EXCEPTION 'pgfence: no fencing token for % on protected table %', op, rel::pg_catalog.regclass
            USING ERRCODE = 'FN002', DETAIL = pg_catalog.format('resource=%s token=NULL', res),
                  HINT = pg_catalog.format('assign the token column in the statement, or call fence.use_token(%L, token) earlier in this transaction', res);
    END IF;
    RETURN tok;
END
$$;

-- The body of a row guard. With col (a token-column guard; one function per
-- column name, shared by every table whose token column has that name, see
-- fence._guard_function) or without (fence._guard_use_token). The same
-- function serves two triggers that fence.protect creates:
--
--   ~fence_guard_0_mark  BEFORE UPDATE OF col    (token-column tables only)
--   ~fence_guard_1_row   BEFORE INSERT OR UPDATE OR DELETE
--
-- How a write presents its token, and why the guard cannot be fooled about
-- it (docs/design.md, "Fail closed"):
--
-- * INSERT: the new row's token column (the statement assigned it, or its
--   default did); NULL falls back to fence.use_token.
-- * UPDATE: PostgreSQL fires an UPDATE OF col trigger exactly when the
--   statement's SET list names col (not when the value changes). The mark
--   trigger then stores the assigned token negated, and the row trigger,
--   which fires next for the same row (BEFORE row triggers fire row by row,
--   in byte order of their names; '~' sorts after every letter, digit and
--   '_', so both come after the table's own BEFORE triggers), takes a
--   negative value that differs from the old row's as "assigned" and
--   restores it. The guard therefore checks the row as the table's other
--   BEFORE triggers left it: a value they write into col is checked, and a
--   positive value they write reads as "not assigned". One exception the
--   server imposes: a MERGE counts col as assigned for all of its UPDATE
--   actions when any one of them assigns it, so the rows of its other
--   UPDATE actions present the token they already carry (docs/sql.md). An UPDATE that does not assign col
--   keeps the old row's value, which is never negative-and-different, so it
--   must present its token through fence.use_token: a row that already
--   carries the latest token proves nothing about the writer. (A row left
--   with a negative token from before protection reads as "not assigned":
--   it can only cause a refusal, never an acceptance.) No session state is
--   involved, so no setting can forge the mark.
-- * DELETE (and TRUNCATE, fence._guard_stmt): fence.use_token.
--
-- Then the check, on every row (there is no "checked once" shortcut, so a
-- grant earlier in the same transaction is seen, and nothing can be forged
-- into a skip): the resource's gate in share mode, held to the end of the
-- transaction, then the latest token; under READ COMMITTED a plain read (a
-- snapshot taken after the gate), otherwise fence.check (a FOR KEY SHARE
-- lock, see 001). Reading fence.lease needs the kit's usage
-- (fence.grant_usage), so a role without it cannot write at all (42501),
-- whatever it sets. Errors come from fence.check, called again only on the
-- failing path.
--
-- The guard runs with the writer's rights and search_path (pinning one would
-- cost a setting change per row): every name, operator and type below is
-- schema-qualified, the declared variables' types too (PL/pgSQL resolves
-- them through the writer's search_path when it compiles the guard in the
-- writer's session, and pg_temp is searched for types before pg_catalog: a
-- temporary type named text, with casts of the writer's, redirected the
-- resource name to another resource; TestShadowedTextTypeRedirectsTheGuard),
-- and the bigint column is read directly (no casts of user types run).
CREATE FUNCTION fence._guard_source(col name) RETURNS text
LANGUAGE sql IMMUTABLE
AS $f$
    SELECT pg_catalog.concat(
$s$
DECLARE
    res    pg_catalog.text := TG_ARGV[0];
    tok    pg_catalog.int8;
    latest pg_catalog.int8;
    reg    pg_catalog.text;
BEGIN
$s$,
        CASE WHEN col IS NOT NULL THEN pg_catalog.replace(
$s$
    IF TG_NAME OPERATOR(pg_catalog.=) '~fence_guard_0_mark' THEN
        IF NEW.@C@ OPERATOR(pg_catalog.<=) 0 THEN
            PERFORM fence.check(res, NEW.@C@);
        END IF;
        NEW.@C@ := OPERATOR(pg_catalog.-) NEW.@C@;
        RETURN NEW;
    END IF;
    IF TG_OP OPERATOR(pg_catalog.=) 'INSERT' THEN
        tok := NEW.@C@;
    ELSIF TG_OP OPERATOR(pg_catalog.=) 'UPDATE' AND NEW.@C@ OPERATOR(pg_catalog.<) 0
          AND (OLD.@C@ IS NULL OR NEW.@C@ OPERATOR(pg_catalog.<>) OLD.@C@) THEN
        tok := OPERATOR(pg_catalog.-) NEW.@C@;
    END IF;
$s$, '@C@', pg_catalog.quote_ident(col))
        END,
$s$
    IF tok IS NULL THEN
        -- the token fence.use_token registered (read here, not through
        -- fence._registered_token, which raises FN002 when there is none)
        reg := pg_catalog.current_setting('fence.tokens', true);
        IF reg OPERATOR(pg_catalog.<>) '' THEN
            tok := (reg::pg_catalog.jsonb OPERATOR(pg_catalog.->>) res)::bigint;
        END IF;
        IF tok IS NULL THEN
            tok := fence._registered_token(res, TG_OP, TG_RELID);
        END IF;
    END IF;
$s$,
$s$
    PERFORM pg_catalog.pg_advisory_xact_lock_shared(fence._gate_key(res));
    IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed' THEN
        SELECT x.token INTO latest FROM fence.lease x WHERE x.resource OPERATOR(pg_catalog.=) res;
        IF latest IS NULL OR latest OPERATOR(pg_catalog.<>) tok THEN
            PERFORM fence.check(res, tok);
        END IF;
    ELSE
        PERFORM fence.check(res, tok);
    END IF;
    IF TG_OP OPERATOR(pg_catalog.=) 'DELETE' THEN
        RETURN OLD;
    END IF;
$s$,
        CASE WHEN col IS NOT NULL THEN pg_catalog.replace(
$s$
    IF TG_OP OPERATOR(pg_catalog.=) 'UPDATE' AND OLD.@C@ OPERATOR(pg_catalog.>) tok THEN
        RAISE EXCEPTION 'pgfence: stale fencing token % for resource %: the row already carries token %', tok, res, OLD.@C@
            USING ERRCODE = 'FN001', DETAIL = pg_catalog.format('resource=%s token=%s row_token=%s', res, tok, OLD.@C@),
                  HINT = 'an update may never lower the token column; acquire the lease again and use the new token';
    END IF;
    NEW.@C@ := tok;
$s$, '@C@', pg_catalog.quote_ident(col))
        END,
$s$
    RETURN NEW;
END
$s$)
$f$;

-- The row guard of every table without a token column.
DO $$
BEGIN
    EXECUTE pg_catalog.format('CREATE FUNCTION fence._guard_use_token() RETURNS trigger LANGUAGE plpgsql VOLATILE AS %L',
                              fence._guard_source(NULL));
END
$$;
COMMENT ON FUNCTION fence._guard_use_token() IS 'pgfence row guard of tables protected without a token column (body: fence._guard_source(NULL))';

-- The row guard for token column col: fence._guard_<md5(col)>(), created on
-- first use. Its body is a pure function of col (fence._guard_source), so
-- whoever calls this can only ever create the same function for the same
-- name: that is why it may be SECURITY DEFINER (the kit's owner creates
-- functions in schema fence) and executable by every role with the kit's
-- usage. EXECUTE on the guard (needed by CREATE TRIGGER) goes to the roles
-- that may run fence.protect; a trigger function cannot be called directly.
CREATE FUNCTION fence._guard_function(col name) RETURNS regprocedure
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    fname text := '_guard_' || md5(col);
    fn    regprocedure;
    rl    name;
BEGIN
    -- concurrent first protects of one column name: one creates, the other waits
    PERFORM pg_advisory_xact_lock(fence._gate_key('guard function ' || fname));
    fn := to_regprocedure(format('fence.%I()', fname));
    IF fn IS NULL THEN
        EXECUTE format('CREATE FUNCTION fence.%I() RETURNS trigger LANGUAGE plpgsql VOLATILE AS %L', fname, fence._guard_source(col));
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

-- The guard of 001/002, kept for tables whose triggers this migration could
-- not re-create (it does not own them): fail closed with what an AFTER
-- trigger can see. It cannot tell whether an UPDATE assigned the token
-- column, so it takes the token from the column only when the value changed
-- (then the statement or a BEFORE trigger of the owner wrote it), and
-- otherwise needs fence.use_token. Re-running fence.protect as the table's
-- owner installs the generated guard.
CREATE OR REPLACE FUNCTION fence._guard_row() RETURNS trigger
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    res pg_catalog.text := TG_ARGV[0];
    col pg_catalog.text := TG_ARGV[1];
    tok pg_catalog.int8;
    old_tok pg_catalog.int8;
BEGIN
    IF col IS NOT NULL AND TG_OP OPERATOR(pg_catalog.<>) 'DELETE' THEN
        tok := (pg_catalog.to_jsonb(NEW) OPERATOR(pg_catalog.->>) col)::bigint;
        IF TG_OP OPERATOR(pg_catalog.=) 'UPDATE' THEN
            old_tok := (pg_catalog.to_jsonb(OLD) OPERATOR(pg_catalog.->>) col)::bigint;
            IF old_tok OPERATOR(pg_catalog.>) tok THEN
                RAISE EXCEPTION 'pgfence: stale fencing token % for resource %: the row already carries token %', tok, res, old_tok
                    USING ERRCODE = 'FN001', DETAIL = pg_catalog.format('resource=%s token=%s row_token=%s', res, tok, old_tok),
                          HINT = 'an update may never lower the token column; acquire the lease again and use the new token';
            END IF;
            IF old_tok IS NOT NULL AND tok OPERATOR(pg_catalog.=) old_tok THEN
                tok := NULL;
            END IF;
        END IF;
    END IF;
    IF tok IS NULL THEN
        tok := fence._registered_token(res, TG_OP, TG_RELID);
    END IF;
    PERFORM fence.check(res, tok);
    RETURN NULL;
END
$$;

-- TRUNCATE guard: as in 001, with the registered token of fence.use_token.
CREATE OR REPLACE FUNCTION fence._guard_stmt() RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM fence.check(TG_ARGV[0], fence._registered_token(TG_ARGV[0], TG_OP, TG_RELID));
    RETURN NULL;
END
$$;

-- 002's form, now unused.
DROP FUNCTION fence._registered_token(text, text, text);

-- The guard triggers of tbl (any version of the kit): the triggers whose
-- function lives in schema fence.
CREATE FUNCTION fence._guard_triggers(tbl regclass) RETURNS SETOF name
LANGUAGE sql STABLE
AS $$
    SELECT t.tgname FROM pg_catalog.pg_trigger t
      JOIN pg_catalog.pg_proc p ON p.oid OPERATOR(pg_catalog.=) t.tgfoid
     WHERE t.tgrelid OPERATOR(pg_catalog.=) tbl
       AND p.pronamespace OPERATOR(pg_catalog.=) 'fence'::pg_catalog.regnamespace
       AND NOT t.tgisinternal
$$;

-- The table's schema-qualified name after the checks that protect and
-- unprotect share: it exists, and the caller may change its triggers (it is
-- the owner, or a member of the owning role).
CREATE FUNCTION fence._owned_table(tbl regclass, action text) RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c record;
BEGIN
    IF tbl IS NULL THEN
        RAISE EXCEPTION 'pgfence: table must not be NULL' USING ERRCODE = '22004', HINT = 'pass a table name, for example ''public.orders''';
    END IF;
    SELECT r.relowner, n.nspname, r.relname INTO c
      FROM pg_class r JOIN pg_namespace n ON n.oid = r.relnamespace
     WHERE r.oid = tbl;
    IF c.relname IS NULL THEN
        RAISE EXCEPTION 'pgfence: there is no table with OID %', tbl::oid
            USING ERRCODE = '42P01', HINT = 'pass the name of an existing table';
    END IF;
    IF NOT pg_has_role(current_user, c.relowner, 'USAGE') THEN
        RAISE EXCEPTION 'pgfence: only the owner of table % can %', tbl, action
            USING ERRCODE = '42501', HINT = format('run fence.%s as the role that owns the table', action);
    END IF;
    RETURN format('%I.%I', c.nspname, c.relname);
END
$$;

-- Installs the guard triggers on tbl (replacing any earlier ones, of any
-- version). Runs with the caller's rights: only the table's owner may
-- protect it. With token_column, every later grant of resource is made to
-- exceed the largest token the column already holds (rows restored from a
-- dump, or written before a re-install): if that needs the token epoch to
-- move, only the kit's owner or an operator may do it (fence._raise_floor).
CREATE OR REPLACE FUNCTION fence.protect(tbl regclass, resource text, token_column name DEFAULT NULL) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    c     record;
    tg    name;
    typ   oid;
    dom   oid;
    qn    text;
    fn    regprocedure;
    floor bigint;
BEGIN
    qn := fence._owned_table(tbl, 'protect');
    PERFORM fence._check_name('resource', resource);
    SELECT r.relkind, n.nspname INTO c
      FROM pg_class r JOIN pg_namespace n ON n.oid = r.relnamespace WHERE r.oid = tbl;
    IF c.nspname = 'fence' THEN
        RAISE EXCEPTION 'pgfence: % belongs to the kit itself and cannot be protected', tbl
            USING ERRCODE = '42809', HINT = 'protect your application''s tables';
    END IF;
    IF c.relkind <> 'r' THEN
        RAISE EXCEPTION 'pgfence: % is not an ordinary table', tbl
            USING ERRCODE = '42809', HINT = 'protect a plain table; partitioned tables and views cannot be protected';
    END IF;
    -- As in 001: refuse both sides of an existing inheritance or partition
    -- tree (a table attached later stays guarded: row triggers fire on the
    -- table that holds the row).
    IF EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = tbl OR i.inhparent = tbl) THEN
        RAISE EXCEPTION 'pgfence: % is part of an inheritance or partition tree', tbl
            USING ERRCODE = '42809', HINT = 'protect a plain table with no parent and no children (it may be attached as a partition afterwards)';
    END IF;
    IF token_column IS NOT NULL THEN
        SELECT a.atttypid INTO typ FROM pg_attribute a
         WHERE a.attrelid = tbl AND a.attname = token_column AND a.attnum > 0 AND NOT a.attisdropped;
        IF typ IS NULL THEN
            RAISE EXCEPTION 'pgfence: column % of table % does not exist', token_column, tbl
                USING ERRCODE = '42703', HINT = 'pass the name of the table''s bigint token column, or NULL to use fence.use_token';
        END IF;
        IF EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = tbl AND a.attname = token_column AND a.attgenerated <> '') THEN
            RAISE EXCEPTION 'pgfence: token column % of table % is a generated column', token_column, tbl
                USING ERRCODE = '42809', HINT = 'a write presents its token by assigning the column: use a plain bigint column';
        END IF;
        -- A domain over bigint is fine if it has no CHECK constraint: the
        -- guard stores the assigned token negated for an instant (see
        -- fence._guard_source), which a CHECK on the domain would refuse.
        WHILE (SELECT t.typtype FROM pg_type t WHERE t.oid = typ) = 'd' LOOP
            dom := typ;
            IF EXISTS (SELECT 1 FROM pg_constraint k WHERE k.contypid = dom) THEN
                RAISE EXCEPTION 'pgfence: token column % of table % has domain type % with a constraint', token_column, tbl, dom::regtype
                    USING ERRCODE = '42804', HINT = format('use plain bigint: ALTER TABLE %s ALTER COLUMN %I TYPE bigint', qn, token_column);
            END IF;
            typ := (SELECT t.typbasetype FROM pg_type t WHERE t.oid = typ);
        END LOOP;
        IF typ <> 'pg_catalog.int8'::regtype::oid THEN
            RAISE EXCEPTION 'pgfence: token column % of table % has type %, not bigint', token_column, tbl, typ::regtype
                USING ERRCODE = '42804', HINT = format('tokens need 63 bits: ALTER TABLE %s ALTER COLUMN %I TYPE bigint', qn, token_column);
        END IF;
        fn := fence._guard_function(token_column);
    END IF;

    FOR tg IN SELECT fence._guard_triggers(tbl) LOOP
        EXECUTE format('DROP TRIGGER %I ON %s', tg, qn);
    END LOOP;
    IF token_column IS NOT NULL THEN
        EXECUTE format('CREATE TRIGGER "~fence_guard_0_mark" BEFORE UPDATE OF %I ON %s FOR EACH ROW EXECUTE FUNCTION %s(%L, %L)',
                       token_column, qn, fn::regproc, resource, token_column);
        EXECUTE format('CREATE TRIGGER "~fence_guard_1_row" BEFORE INSERT OR UPDATE OR DELETE ON %s FOR EACH ROW EXECUTE FUNCTION %s(%L, %L)',
                       qn, fn::regproc, resource, token_column);
    ELSE
        EXECUTE format('CREATE TRIGGER "~fence_guard_1_row" BEFORE INSERT OR UPDATE OR DELETE ON %s FOR EACH ROW EXECUTE FUNCTION fence._guard_use_token(%L)',
                       qn, resource);
    END IF;
    EXECUTE format('CREATE TRIGGER zz_fence_guard_stmt BEFORE TRUNCATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION fence._guard_stmt(%L)',
                   qn, resource);

    -- The floor, read after CREATE TRIGGER locked out concurrent writers.
    IF token_column IS NOT NULL THEN
        EXECUTE format('SELECT max(%I) FROM %s', token_column, qn) INTO floor;
        IF floor > fence._token_floor() THEN
            IF NOT has_function_privilege('fence._raise_floor(bigint)', 'EXECUTE') THEN
                RAISE EXCEPTION 'pgfence: column % of % holds token %, above every token granted so far', token_column, tbl, floor
                    USING ERRCODE = '42501',
                          HINT = 'the rows come from a restore or an earlier install: have the kit''s owner or an operator run this fence.protect, so later grants exceed them';
            END IF;
            PERFORM fence._raise_floor(floor);
        END IF;
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION fence.unprotect(tbl regclass) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    qn text := fence._owned_table(tbl, 'unprotect');
    tg name;
BEGIN
    FOR tg IN SELECT fence._guard_triggers(tbl) LOOP
        EXECUTE format('DROP TRIGGER %I ON %s', tg, qn);
    END LOOP;
END
$$;

-- ---------------------------------------------------------------------------
-- Views and privileges
-- ---------------------------------------------------------------------------

-- As in 001, over the guards of every version, plus trigger_roles: the roles
-- other than the table's owner (and its members) that hold the TRIGGER
-- privilege on it. Such a role can add a trigger that rewrites rows after
-- the guard checked them, so it can get around the guard
-- (docs/security.md).
CREATE OR REPLACE VIEW fence.protected AS
SELECT t.tgrelid::regclass AS tbl,
       fence._trigger_arg(t.tgargs, 0) AS resource,
       (max(fence._trigger_arg(t.tgargs, 1)) FILTER (WHERE t.tgname IN ('zz_fence_guard_row', '~fence_guard_1_row')))::name AS token_column,
       (SELECT pg_catalog.array_agg(r.rolname ORDER BY r.rolname)
          FROM pg_catalog.pg_roles r, pg_catalog.pg_class c
         WHERE c.oid = t.tgrelid
           AND NOT r.rolsuper
           AND NOT pg_catalog.pg_has_role(r.oid, c.relowner, 'USAGE')
           AND pg_catalog.has_table_privilege(r.oid, t.tgrelid, 'TRIGGER')) AS trigger_roles
  FROM pg_catalog.pg_trigger t
 WHERE t.tgname IN ('zz_fence_guard_row', '~fence_guard_1_row', 'zz_fence_guard_stmt')
   AND t.tgfoid IN (SELECT p.oid FROM pg_catalog.pg_proc p WHERE p.pronamespace = 'fence'::pg_catalog.regnamespace)
 GROUP BY t.tgrelid, fence._trigger_arg(t.tgargs, 0);
COMMENT ON VIEW fence.protected IS
    'every table guarded by fence.protect: resource, token column (NULL: fence.use_token), and the roles other than the owner that can create triggers on it';

-- As in 001, plus what the guards now need as the writer: SELECT on
-- fence.lease (they read the latest token themselves), the helpers they
-- call, fence._guard_function and fence._token_floor for fence.protect, the
-- row guards for CREATE TRIGGER, and for operators fence._raise_floor.
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
    EXECUTE format('GRANT SELECT ON fence.leases, fence.protected, fence.lease TO %I', role);
    EXECUTE format('GRANT EXECUTE ON FUNCTION fence.acquire(text, text, interval, boolean), fence.acquire_session(text, text),
        fence.renew(text, bigint, interval), fence.release(text, bigint), fence.check(text, bigint),
        fence.use_token(text, bigint), fence.protect(regclass, text, name), fence.unprotect(regclass),
        fence._guard_row(), fence._guard_stmt(), fence._guard_use_token(),
        fence._registered_token(text, text, oid),
        fence._check_name(text, text), fence._lease_key(text, bigint), fence._gate_key(text), fence._trigger_arg(bytea, integer),
        fence._guard_function(name), fence._token_floor(), fence._guard_triggers(regclass), fence._owned_table(regclass, text),
        fence.lock_key(text), fence.try_lock(text), fence.unlock(text),
        fence.try_xact_lock(text), fence.version() TO %I', role);
    FOR fn IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
               WHERE p.pronamespace = 'fence'::pg_catalog.regnamespace AND p.proname ~ '^_guard_[0-9a-f]{32}$' LOOP
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
AS $$ SELECT 3 $$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA fence FROM PUBLIC;
REVOKE ALL ON SEQUENCE fence.token_counter FROM PUBLIC;

-- Roles that had the kit's usage get what the new guards need; operators
-- (EXECUTE on fence.revoke) stay operators.
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
        PERFORM fence.grant_usage(r.rolname, r.op);
    END LOOP;
END
$$;

-- Existing protected tables get the new guards where this role may re-create
-- their triggers; the others keep the fail-closed generic guard above.
DO $$
DECLARE
    p record;
    kept text;
BEGIN
    FOR p IN SELECT v.tbl, v.resource, v.token_column, c.relowner
               FROM fence.protected v JOIN pg_catalog.pg_class c ON c.oid = v.tbl::oid LOOP
        IF pg_catalog.pg_has_role(current_user, p.relowner, 'USAGE') THEN
            PERFORM fence.protect(p.tbl, p.resource, p.token_column);
        ELSE
            kept := pg_catalog.concat_ws(', ', kept, p.tbl::text);
        END IF;
    END LOOP;
    IF kept IS NOT NULL THEN
        RAISE WARNING 'pgfence: these protected tables keep the generic guard of migration 002, now fail-closed: %', kept
            USING HINT = 'their owners should run SELECT fence.protect(table, resource, token_column) again to install the faster generated guard (see fence.protected)';
    END IF;
END
$$;
