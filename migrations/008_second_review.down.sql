-- Back to pgfence 007: the functions as 007 left them (their bodies as
-- pg_get_functiondef prints them, so each is exactly what 007 installed),
-- the generated guards rebuilt from 007's sources, fence.leases without
-- expires_in (its SELECT grants kept), and no floor sequence, refusal
-- counters, fence.refusals, fence._refuse, fence._epoch_within,
-- fence._columns_of, fence._check or fence._guard_slow. A view of yours on
-- fence.leases makes the down fail (drop it first).

CREATE OR REPLACE FUNCTION fence."check"(resource text, token bigint)
 RETURNS void
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
$function$;
COMMENT ON FUNCTION fence."check"(text,bigint) IS 'raises FN001 (stale), FN002 (no token) or FN003 (never granted) unless token is the latest grant; holds the resource''s gate so a new grant waits for this transaction';

CREATE OR REPLACE FUNCTION fence._registered_token(res text, op text, rel oid)
 RETURNS bigint
 LANGUAGE plpgsql
 STABLE
AS $function$
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
$function$;

CREATE OR REPLACE FUNCTION fence._check_many(res text[], tok bigint[], op text, rel oid)
 RETURNS void
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
        RAISE EXCEPTION 'pgfence: a row of % has no resource: its resource column is NULL', rel::regclass
            USING ERRCODE = 'FN003', DETAIL = 'resource=NULL',
                  HINT = 'declare the resource column NOT NULL';
    END IF;
    IF bad.t IS NULL THEN
        PERFORM fence._registered_token(bad.r, op, rel);
    END IF;
    PERFORM fence.check(bad.r, bad.t);
    -- fence.check passed: the lease row changed between the two reads (it
    -- cannot while we hold the gate or the lock; refuse all the same)
    RAISE EXCEPTION 'pgfence: stale fencing token % for resource %', bad.t, bad.r
        USING ERRCODE = 'FN001', DETAIL = format('resource=%s token=%s', bad.r, bad.t),
              HINT = 'acquire the lease again and use the new token';
END
$function$;

CREATE OR REPLACE FUNCTION fence._cache_epoch(c fence.epoch_cache)
 RETURNS bigint
 LANGUAGE sql
AS $function$
    SELECT CASE WHEN c.system_identifier OPERATOR(pg_catalog.=) fence._system_identifier()
                 AND c.datoid OPERATOR(pg_catalog.=) fence._database_oid()
                 AND c.relid OPERATOR(pg_catalog.=) 'fence.epoch_state'::pg_catalog.regclass::pg_catalog.oid
                 AND c.timeline OPERATOR(pg_catalog.=) fence._timeline()
                 AND c.base OPERATOR(pg_catalog.+) c.timeline OPERATOR(pg_catalog.<) (1::pg_catalog.int8 OPERATOR(pg_catalog.<<) 20)
           THEN c.base OPERATOR(pg_catalog.+) c.timeline END
$function$;

CREATE OR REPLACE FUNCTION fence._epoch()
 RETURNS bigint
 LANGUAGE plpgsql
AS $function$
DECLARE
    sysid bigint := fence._system_identifier();
    mydb  oid := fence._database_oid();
    myrel oid := 'fence.epoch_state'::pg_catalog.regclass::oid;
    tli   bigint := fence._timeline();
    s     fence.epoch_state;
    home  boolean;
    nbase bigint;
BEGIN
    IF NOT EXISTS (SELECT FROM fence.epoch_state) THEN
        -- First grant of this install, or of a restore that brought lease
        -- rows but no state: start past every stored token.
        INSERT INTO fence.epoch_state (system_identifier, relid, timeline, base)
        VALUES (sysid, myrel, tli, coalesce((SELECT max(l.token) >> 43 FROM fence.lease l), 0))
        ON CONFLICT DO NOTHING;
    END IF;
    SELECT * INTO s FROM fence.epoch_state FOR UPDATE;
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
    -- This transaction's commit is flushed before it returns, whatever
    -- synchronous_commit is at COMMIT: the counter's move and the new state
    -- are durable before any token above them is used.
    TRUNCATE fence.commit_flush;
    DELETE FROM fence.epoch_cache;
    INSERT INTO fence.epoch_cache (system_identifier, datoid, relid, timeline, base)
    VALUES (sysid, mydb, myrel, tli, nbase);
    RETURN nbase + tli;
END
$function$;

CREATE OR REPLACE FUNCTION fence._lock_lease(res text, wait_ms bigint, OUT locked boolean, OUT lease fence.lease)
 RETURNS record
 LANGUAGE plpgsql
AS $function$
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
$function$;

CREATE OR REPLACE FUNCTION fence._grant(resource text, holder text, kind text, ttl interval, force boolean, waiting boolean)
 RETURNS bigint
 LANGUAGE plpgsql
AS $function$
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
$function$;

CREATE OR REPLACE FUNCTION fence._raise_floor(floor bigint)
 RETURNS void
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
    DELETE FROM fence.epoch_cache;
END
$function$;

CREATE OR REPLACE FUNCTION fence._guard_maker(tbl regclass)
 RETURNS void
 LANGUAGE plpgsql
 STABLE
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    IF pg_has_role(fence._acting_role(), (SELECT c.relowner FROM pg_class c WHERE c.oid = tbl), 'USAGE') IS NOT TRUE THEN
        RAISE EXCEPTION 'pgfence: only the owner of table % can make the kit create its guard', tbl
            USING ERRCODE = '42501', HINT = 'run fence.protect or fence.protect_rows as the role that owns the table';
    END IF;
END
$function$;

CREATE OR REPLACE FUNCTION fence._guard_function(tbl regclass, col name)
 RETURNS regprocedure
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    fname text := '_guard_' || md5(col);
    fn    regprocedure;
    rl    name;
BEGIN
    PERFORM fence._guard_maker(tbl);
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
$function$;

CREATE OR REPLACE FUNCTION fence._rows_function(tbl regclass, rcol name, tcol name)
 RETURNS regprocedure
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    fname text := '_rows_' || md5(format('%I,%s', rcol, coalesce(quote_ident(tcol), '')));
    fn    regprocedure;
    rl    name;
BEGIN
    PERFORM fence._guard_maker(tbl);
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
$function$;

CREATE OR REPLACE FUNCTION fence._protectable(tbl regclass)
 RETURNS void
 LANGUAGE plpgsql
 STABLE
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    c record;
BEGIN
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
    IF EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = tbl OR i.inhparent = tbl) THEN
        RAISE EXCEPTION 'pgfence: % is part of an inheritance or partition tree', tbl
            USING ERRCODE = '42809', HINT = 'protect a plain table with no parent and no children (it may be attached as a partition afterwards)';
    END IF;
END
$function$;

CREATE OR REPLACE FUNCTION fence._guard_source(col name)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT pg_catalog.format(pg_catalog.concat(
$s$
DECLARE
    res    pg_catalog.text := TG_ARGV[0];
    tok    pg_catalog.int8;
    ok     pg_catalog.bool;
    reg    pg_catalog.text;
BEGIN
$s$,
        CASE WHEN col IS NOT NULL THEN 
$s$
    IF TG_NAME OPERATOR(pg_catalog.=) '~fence_guard_0_mark' THEN
        IF NEW.%1$I OPERATOR(pg_catalog.<=) 0 THEN
            PERFORM fence.check(res, NEW.%1$I);
        END IF;
        NEW.%1$I := OPERATOR(pg_catalog.-) NEW.%1$I;
        RETURN NEW;
    END IF;
    IF TG_OP OPERATOR(pg_catalog.=) 'INSERT' THEN
        tok := NEW.%1$I;
    ELSIF TG_OP OPERATOR(pg_catalog.=) 'UPDATE' AND NEW.%1$I OPERATOR(pg_catalog.<) 0
          AND (OLD.%1$I IS NULL OR NEW.%1$I OPERATOR(pg_catalog.<>) OLD.%1$I) THEN
        tok := OPERATOR(pg_catalog.-) NEW.%1$I;
    END IF;
$s$
        END,
$s$
    IF CURRENT_USER OPERATOR(pg_catalog.<>) fence._acting_role() THEN
        PERFORM fence._acting_role_check(TG_RELID);
    END IF;
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
    -- One query: the gate, tried, then the row as this statement's snapshot
    -- sees it. A version nobody updated or locked since it was written
    -- (xmax 0), read while we hold the gate, is the latest one at any
    -- isolation level, and stays so until we end: a grant takes the gate
    -- before it locks the row, and one that committed after our snapshot
    -- left its xmax on the version we see. Anything else, fence.check
    -- (it waits for the gate, locks the row under REPEATABLE READ, and
    -- words the error). docs/design.md, "Linearizable fencing".
    SELECT pg_catalog.pg_try_advisory_xact_lock_shared(fence._gate_key(res))
           AND x.xmax OPERATOR(pg_catalog.=) '0'::pg_catalog.xid AND x.token OPERATOR(pg_catalog.=) tok
      INTO ok FROM fence.lease x WHERE x.resource OPERATOR(pg_catalog.=) res;
    IF ok IS NOT TRUE THEN
        PERFORM fence.check(res, tok);
    END IF;
    IF TG_OP OPERATOR(pg_catalog.=) 'DELETE' THEN
        RETURN OLD;
    END IF;
$s$,
        CASE WHEN col IS NOT NULL THEN 
$s$
    IF TG_OP OPERATOR(pg_catalog.=) 'UPDATE' AND OLD.%1$I OPERATOR(pg_catalog.>) tok THEN
        RAISE EXCEPTION 'pgfence: stale fencing token %% for resource %%: the row already carries token %%', tok, res, OLD.%1$I
            USING ERRCODE = 'FN001', DETAIL = pg_catalog.format('resource=%%s token=%%s row_token=%%s', res, tok, OLD.%1$I),
                  HINT = 'an update may never lower the token column; acquire the lease again and use the new token';
    END IF;
    NEW.%1$I := tok;
$s$
        END,
$s$
    RETURN NEW;
END
$s$), col)
$function$;

CREATE OR REPLACE FUNCTION fence._rows_source(rcol name, tcol name)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT pg_catalog.format(pg_catalog.concat(
$s$
#variable_conflict use_variable
DECLARE
    pre pg_catalog.text := TG_ARGV[0];
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
BEGIN
$s$,
        CASE WHEN tcol IS NOT NULL THEN
$s$
    IF TG_LEVEL OPERATOR(pg_catalog.=) 'ROW' THEN
        IF TG_NAME OPERATOR(pg_catalog.=) '~fence_guard_0_mark' THEN
            IF NEW.%2$I OPERATOR(pg_catalog.<=) 0 THEN
                PERFORM fence.check((pre OPERATOR(pg_catalog.||) NEW.%1$I::pg_catalog.text) COLLATE pg_catalog."C", NEW.%2$I);
            END IF;
            NEW.%2$I := OPERATOR(pg_catalog.-) NEW.%2$I;
            RETURN NEW;
        END IF;
        IF TG_OP OPERATOR(pg_catalog.=) 'UPDATE' AND NEW.%2$I OPERATOR(pg_catalog.<) 0
           AND (OLD.%2$I IS NULL OR NEW.%2$I OPERATOR(pg_catalog.<>) OLD.%2$I) THEN
            NEW.%2$I := OPERATOR(pg_catalog.-) NEW.%2$I;
            RETURN NEW;
        END IF;
        IF TG_OP OPERATOR(pg_catalog.=) 'INSERT' AND NEW.%2$I IS NOT NULL THEN
            RETURN NEW;
        END IF;
        res := (pre OPERATOR(pg_catalog.||) NEW.%1$I::pg_catalog.text) COLLATE pg_catalog."C";
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
    -- Rows of inheritance children (created after protect_rows) pass the
    -- statement triggers of this table but not its row triggers: refuse.
    IF EXISTS (SELECT FROM pg_catalog.pg_inherits i WHERE i.inhparent OPERATOR(pg_catalog.=) TG_RELID) THEN
        RAISE EXCEPTION 'pgfence: per-row protected table %% has inheritance children', TG_RELID::pg_catalog.regclass
            USING ERRCODE = '42809',
                  HINT = 'the guard does not see the children''s rows as they are written: drop the children (or ALTER TABLE ... NO INHERIT), or fence.unprotect the table';
    END IF;
    IF CURRENT_USER OPERATOR(pg_catalog.<>) fence._acting_role() THEN
        PERFORM fence._acting_role_check(TG_RELID);
    END IF;
    reg := pg_catalog.current_setting('fence.tokens', true);
    IF reg OPERATOR(pg_catalog.<>) '' THEN
        regj := reg::pg_catalog.jsonb;
    END IF;
    IF TG_OP OPERATOR(pg_catalog.=) 'INSERT' THEN
        SELECT pg_catalog.array_agg(q.r), pg_catalog.array_agg(q.t) INTO rs, ts FROM (
            SELECT DISTINCT (pre OPERATOR(pg_catalog.||) n.%1$I::pg_catalog.text) COLLATE pg_catalog."C" AS r, $s$,
        CASE WHEN tcol IS NOT NULL THEN 'n.%2$I'
             ELSE $s$(regj OPERATOR(pg_catalog.->>) ((pre OPERATOR(pg_catalog.||) n.%1$I::pg_catalog.text) COLLATE pg_catalog."C"))::pg_catalog.int8$s$ END,
$s$ AS t FROM fence_new n) q;
    ELSIF TG_OP OPERATOR(pg_catalog.=) 'DELETE' THEN
        SELECT pg_catalog.array_agg(q.r), pg_catalog.array_agg((regj OPERATOR(pg_catalog.->>) q.r)::pg_catalog.int8) INTO rs, ts FROM (
            SELECT DISTINCT (pre OPERATOR(pg_catalog.||) o.%1$I::pg_catalog.text) COLLATE pg_catalog."C" AS r FROM fence_old o) q;
    ELSE
$s$,
        CASE WHEN tcol IS NOT NULL THEN
$s$
        SELECT pg_catalog.array_agg(q.r), pg_catalog.array_agg(q.t) INTO rs, ts FROM (
            SELECT DISTINCT (pre OPERATOR(pg_catalog.||) n.%1$I::pg_catalog.text) COLLATE pg_catalog."C" AS r, n.%2$I AS t FROM fence_new n
            UNION ALL
            SELECT g.r, (regj OPERATOR(pg_catalog.->>) g.r)::pg_catalog.int8 FROM (
                SELECT DISTINCT (pre OPERATOR(pg_catalog.||) o.%1$I::pg_catalog.text) COLLATE pg_catalog."C" AS r FROM fence_old o) g
             WHERE NOT EXISTS (SELECT FROM fence_new n
                                WHERE (pre OPERATOR(pg_catalog.||) n.%1$I::pg_catalog.text) COLLATE pg_catalog."C" OPERATOR(pg_catalog.=) g.r)) q;
$s$
        ELSE
$s$
        SELECT pg_catalog.array_agg(q.r), pg_catalog.array_agg((regj OPERATOR(pg_catalog.->>) q.r)::pg_catalog.int8) INTO rs, ts FROM (
            SELECT (pre OPERATOR(pg_catalog.||) n.%1$I::pg_catalog.text) COLLATE pg_catalog."C" AS r FROM fence_new n
            UNION
            SELECT (pre OPERATOR(pg_catalog.||) o.%1$I::pg_catalog.text) COLLATE pg_catalog."C" FROM fence_old o) q;
$s$
        END,
$s$
    END IF;
    IF rs IS NULL THEN
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
    n := pg_catalog.cardinality(rs);
    IF n OPERATOR(pg_catalog.<=) 16 THEN
        reg := pg_catalog.current_setting('fence._gates', true);
        held := CASE WHEN reg OPERATOR(pg_catalog.~) '^[0-9]{1,4}$' THEN reg::pg_catalog.int4
                     WHEN COALESCE(reg, '') OPERATOR(pg_catalog.=) '' THEN 0 ELSE 64 END;
        IF held OPERATOR(pg_catalog.+) n OPERATOR(pg_catalog.<=) 64 AND pg_catalog.array_position(rs, NULL) IS NULL THEN
            IF n OPERATOR(pg_catalog.=) 1 THEN
                PERFORM pg_catalog.pg_advisory_xact_lock_shared(fence._gate_key(rs[1]));
            ELSE
                PERFORM pg_catalog.pg_advisory_xact_lock_shared(g.k)
                   FROM (SELECT DISTINCT fence._gate_key(u.r) AS k FROM pg_catalog.unnest(rs) AS u(r)) g ORDER BY g.k;
            END IF;
            PERFORM pg_catalog.set_config('fence._gates', (held OPERATOR(pg_catalog.+) n)::pg_catalog.text, true);
            IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed' THEN
                NULL;  -- the row locks of fence._check_many
            ELSIF n OPERATOR(pg_catalog.=) 1 THEN
                -- one resource (most statements): a plain read by key
                SELECT x.token OPERATOR(pg_catalog.<>) ts[1] INTO stale FROM fence.lease x WHERE x.resource OPERATOR(pg_catalog.=) rs[1];
                IF stale IS FALSE THEN
                    RETURN NULL;
                END IF;
            ELSE
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
$function$;

CREATE OR REPLACE FUNCTION fence.grant_usage(role name, operator boolean DEFAULT false)
 RETURNS void
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
        fence.protect_rows(regclass, name, text, name),
        fence._guard_row(), fence._guard_stmt(), fence._guard_use_token(), fence._rows_truncate(),
        fence._registered_token(text, text, oid), fence._check_many(text[], bigint[], text, oid),
        fence._check_name(text, text), fence._lease_key(text, bigint), fence._gate_key(text), fence._trigger_arg(bytea, integer),
        fence._guard_function(regclass, name), fence._rows_function(regclass, name, name),
        fence._acting_role(), fence._acting_role_check(oid), fence.fire_always(regclass, boolean), fence._pin_condition(name, name), fence._token_floor(), fence._guard_triggers(regclass),
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
$function$;
COMMENT ON FUNCTION fence.grant_usage(name,boolean) IS 'grants role the use of the kit (leases, guards, advisory helpers); with operator => true also fence.revoke';

CREATE OR REPLACE FUNCTION fence.version()
 RETURNS integer
 LANGUAGE sql
 IMMUTABLE
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$ SELECT 7 $function$;
COMMENT ON FUNCTION fence.version() IS 'the migration version of the installed pgfence schema';

CREATE OR REPLACE FUNCTION fence.use_token(resource text, token bigint)
 RETURNS void
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_variable
DECLARE
    m jsonb;
BEGIN
    PERFORM fence.check(resource, token);
    m := coalesce(nullif(pg_catalog.current_setting('fence.tokens', true), '')::jsonb, '{}'::jsonb);
    PERFORM pg_catalog.set_config('fence.tokens',
        pg_catalog.jsonb_set(m, ARRAY[resource], pg_catalog.to_jsonb(token))::text, true);
END
$function$;
COMMENT ON FUNCTION fence.use_token(text,bigint) IS 'fence.check, then remembers the token for the rest of the transaction for guarded tables without a token column';

CREATE OR REPLACE FUNCTION fence._durable()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    durable text;
BEGIN
    durable := fence._force_durable();
    RETURN NULL;
END
$function$;

DO $$
DECLARE
    grantees name[];
    r name;
BEGIN
    SELECT array_agg(DISTINCT g.grantee::regrole::name) INTO grantees
      FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) g
     WHERE c.oid = 'fence.leases'::pg_catalog.regclass AND g.privilege_type = 'SELECT'
       AND g.grantee <> c.relowner AND g.grantee <> 0;
    DROP VIEW fence.leases;
    EXECUTE $v$CREATE VIEW fence.leases AS
 SELECT l.resource,
    l.holder,
    l.token,
    l.kind,
    l.acquired_at,
    l.expires_at,
    l.ended_at,
        CASE
            WHEN l.ended_at IS NOT NULL THEN false
            WHEN l.kind = 'ttl'::text THEN l.expires_at > clock_timestamp()
            WHEN l.kind = 'session'::text THEN (EXISTS ( SELECT 1
               FROM pg_locks k
              WHERE k.locktype = 'advisory'::text AND k.granted AND k.pid = l.session_pid AND k.objsubid = 1 AND k.classid::bigint = (fence._lease_key(l.resource, l.token) >> 32) AND k.objid::bigint = (fence._lease_key(l.resource, l.token) & '4294967295'::bigint)))
            ELSE false
        END AS live,
    l.session_pid
   FROM fence.lease l$v$;
    EXECUTE $v$COMMENT ON VIEW fence.leases IS 'every resource ever granted: holder, latest token, kind (ttl, session, revoked), times, and whether the lease is live now by the server clock'$v$;
    -- as every object of the kit: an explicit ACL, nothing for PUBLIC
    REVOKE ALL ON fence.leases FROM PUBLIC;
    FOREACH r IN ARRAY coalesce(grantees, '{}') LOOP
        EXECUTE pg_catalog.format('GRANT SELECT ON fence.leases TO %I', r);
    END LOOP;
END
$$;

-- fence.protected as 007 left it.
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
       (SELECT pg_catalog.bool_and(g.tgenabled <> 'D') FROM pg_catalog.pg_trigger g JOIN pg_catalog.pg_proc p ON p.oid = g.tgfoid
         WHERE g.tgrelid = t.tgrelid AND p.pronamespace = 'fence'::pg_catalog.regnamespace AND NOT g.tgisinternal) AS enabled
  FROM pg_catalog.pg_trigger t
 WHERE t.tgname IN ('zz_fence_guard_row', '~fence_guard_1_row', 'zz_fence_guard_stmt', '~fence_rows_2_upd')
   AND t.tgfoid IN (SELECT p.oid FROM pg_catalog.pg_proc p WHERE p.pronamespace = 'fence'::pg_catalog.regnamespace)
 GROUP BY t.tgrelid, fence._trigger_arg(t.tgargs, 0);
COMMENT ON VIEW fence.protected IS
    'every table guarded by fence.protect (form table: resource) or fence.protect_rows (form rows: resource is the prefix, resource_column names the rest), its token column (NULL: fence.use_token), the roles other than the owner that can create triggers on it, whether its guards fire in replica mode too (fires_always) and whether none is disabled (enabled)';

DROP VIEW fence.refusals;
DROP FUNCTION fence._refuse(text, text, text, text);
DROP FUNCTION fence._epoch_within(bigint);
DROP FUNCTION fence._columns_of(regclass, name[]);
DROP FUNCTION fence._check(text, bigint);
DROP FUNCTION fence._guard_slow(text, bigint, bigint, text, oid);
DROP SEQUENCE fence.refusals_fn001;
DROP SEQUENCE fence.refusals_fn002;
DROP SEQUENCE fence.refusals_fn003;
DROP SEQUENCE fence.epoch_floor;

-- The generated guard functions get 007's bodies back (names, owner,
-- grants and comments stay).
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
