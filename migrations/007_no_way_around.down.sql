-- Back to pgfence 006: the functions as 006 left them (their bodies as
-- pg_get_functiondef prints them, so each is exactly what 006 installed),
-- the generated guards rebuilt from 006's sources, the view without
-- fires_always and enabled, the pin triggers of the per-row tables this
-- role owns back to WHEN (false), and no cache, flush table or origin.
-- Guards switched to fire_always keep firing in replica mode.

CREATE OR REPLACE FUNCTION fence._state_epoch(s fence.epoch_state)
 RETURNS bigint
 LANGUAGE sql
AS $function$
    SELECT CASE WHEN s.system_identifier OPERATOR(pg_catalog.=) fence._system_identifier()
                 AND s.relid OPERATOR(pg_catalog.=) 'fence.epoch_state'::pg_catalog.regclass::pg_catalog.oid
                 AND s.timeline OPERATOR(pg_catalog.=) fence._timeline()
                 AND s.base OPERATOR(pg_catalog.+) s.timeline OPERATOR(pg_catalog.<) (1::pg_catalog.int8 OPERATOR(pg_catalog.<<) 20)
           THEN s.base OPERATOR(pg_catalog.+) s.timeline END
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
    SELECT e AS state, x AS lease INTO r
      FROM fence.epoch_state e LEFT JOIN fence.lease x ON x.resource = resource;
    l := r.lease;
    IF NOT force AND fence._live(l, pg_catalog.clock_timestamp()) AND (NOT waiting OR l.waiters) THEN
        RETURN NULL;
    END IF;
    epoch := fence._state_epoch(r.state);
    IF epoch IS NULL THEN
        PERFORM fence._system_identifier();
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

CREATE OR REPLACE FUNCTION fence._epoch()
 RETURNS bigint
 LANGUAGE plpgsql
AS $function$
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
END
$function$;

CREATE OR REPLACE FUNCTION fence._guard_source(col name)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE
AS $function$
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
$function$;

CREATE OR REPLACE FUNCTION fence._rows_source(rcol name, tcol name)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT pg_catalog.replace(pg_catalog.replace(pg_catalog.replace(pg_catalog.concat(
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
            IF NEW.@T@ OPERATOR(pg_catalog.<=) 0 THEN
                PERFORM fence.check((pre OPERATOR(pg_catalog.||) NEW.@R@::pg_catalog.text) COLLATE pg_catalog."C", NEW.@T@);
            END IF;
            NEW.@T@ := OPERATOR(pg_catalog.-) NEW.@T@;
            RETURN NEW;
        END IF;
        IF TG_OP OPERATOR(pg_catalog.=) 'UPDATE' AND NEW.@T@ OPERATOR(pg_catalog.<) 0
           AND (OLD.@T@ IS NULL OR NEW.@T@ OPERATOR(pg_catalog.<>) OLD.@T@) THEN
            NEW.@T@ := OPERATOR(pg_catalog.-) NEW.@T@;
            RETURN NEW;
        END IF;
        IF TG_OP OPERATOR(pg_catalog.=) 'INSERT' AND NEW.@T@ IS NOT NULL THEN
            RETURN NEW;
        END IF;
        res := (pre OPERATOR(pg_catalog.||) NEW.@R@::pg_catalog.text) COLLATE pg_catalog."C";
        reg := pg_catalog.current_setting('fence.tokens', true);
        IF reg OPERATOR(pg_catalog.<>) '' THEN
            tok := (reg::pg_catalog.jsonb OPERATOR(pg_catalog.->>) res)::pg_catalog.int8;
        END IF;
        IF tok IS NULL THEN
            tok := fence._registered_token(res, TG_OP, TG_RELID);
        END IF;
        NEW.@T@ := tok;
        RETURN NEW;
    END IF;
$s$
        END,
$s$
    -- Rows of inheritance children (created after protect_rows) pass the
    -- statement triggers of this table but not its row triggers: refuse.
    IF EXISTS (SELECT FROM pg_catalog.pg_inherits i WHERE i.inhparent OPERATOR(pg_catalog.=) TG_RELID) THEN
        RAISE EXCEPTION 'pgfence: per-row protected table % has inheritance children', TG_RELID::pg_catalog.regclass
            USING ERRCODE = '42809',
                  HINT = 'the guard does not see the children''s rows as they are written: drop the children (or ALTER TABLE ... NO INHERIT), or fence.unprotect the table';
    END IF;
    reg := pg_catalog.current_setting('fence.tokens', true);
    IF reg OPERATOR(pg_catalog.<>) '' THEN
        regj := reg::pg_catalog.jsonb;
    END IF;
    IF TG_OP OPERATOR(pg_catalog.=) 'INSERT' THEN
        SELECT pg_catalog.array_agg(q.r), pg_catalog.array_agg(q.t) INTO rs, ts FROM (
            SELECT DISTINCT (pre OPERATOR(pg_catalog.||) n.@R@::pg_catalog.text) COLLATE pg_catalog."C" AS r, @NT@ AS t FROM fence_new n) q;
    ELSIF TG_OP OPERATOR(pg_catalog.=) 'DELETE' THEN
        SELECT pg_catalog.array_agg(q.r), pg_catalog.array_agg((regj OPERATOR(pg_catalog.->>) q.r)::pg_catalog.int8) INTO rs, ts FROM (
            SELECT DISTINCT (pre OPERATOR(pg_catalog.||) o.@R@::pg_catalog.text) COLLATE pg_catalog."C" AS r FROM fence_old o) q;
    ELSE
$s$,
        CASE WHEN tcol IS NOT NULL THEN
$s$
        SELECT pg_catalog.array_agg(q.r), pg_catalog.array_agg(q.t) INTO rs, ts FROM (
            SELECT DISTINCT (pre OPERATOR(pg_catalog.||) n.@R@::pg_catalog.text) COLLATE pg_catalog."C" AS r, n.@T@ AS t FROM fence_new n
            UNION ALL
            SELECT g.r, (regj OPERATOR(pg_catalog.->>) g.r)::pg_catalog.int8 FROM (
                SELECT DISTINCT (pre OPERATOR(pg_catalog.||) o.@R@::pg_catalog.text) COLLATE pg_catalog."C" AS r FROM fence_old o) g
             WHERE NOT EXISTS (SELECT FROM fence_new n
                                WHERE (pre OPERATOR(pg_catalog.||) n.@R@::pg_catalog.text) COLLATE pg_catalog."C" OPERATOR(pg_catalog.=) g.r)) q;
$s$
        ELSE
$s$
        SELECT pg_catalog.array_agg(q.r), pg_catalog.array_agg((regj OPERATOR(pg_catalog.->>) q.r)::pg_catalog.int8) INTO rs, ts FROM (
            SELECT (pre OPERATOR(pg_catalog.||) n.@R@::pg_catalog.text) COLLATE pg_catalog."C" AS r FROM fence_new n
            UNION
            SELECT (pre OPERATOR(pg_catalog.||) o.@R@::pg_catalog.text) COLLATE pg_catalog."C" FROM fence_old o) q;
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
$s$),
        '@NT@', CASE WHEN tcol IS NOT NULL THEN 'n.@T@'
                     ELSE '(regj OPERATOR(pg_catalog.->>) ((pre OPERATOR(pg_catalog.||) n.@R@::pg_catalog.text) COLLATE pg_catalog."C"))::pg_catalog.int8' END),
        '@R@', pg_catalog.quote_ident(rcol)),
        -- @T@ occurs only with a token column (in @NT@'s expansion too, so
        -- this replace comes last)
        '@T@', COALESCE(pg_catalog.quote_ident(tcol), ''))
$function$;

CREATE OR REPLACE FUNCTION fence._guard_stmt()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    PERFORM fence.check(TG_ARGV[0], fence._registered_token(TG_ARGV[0], TG_OP, TG_RELID));
    RETURN NULL;
END
$function$;

CREATE OR REPLACE FUNCTION fence._rows_truncate()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    rs  text[];
    ts  bigint[];
    reg jsonb := nullif(current_setting('fence.tokens', true), '')::jsonb;
BEGIN
    -- The rows are read with a snapshot of the transaction's: under
    -- REPEATABLE READ or SERIALIZABLE it may predate rows that TRUNCATE
    -- removes all the same, whose resources would then go unchecked.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'pgfence: TRUNCATE of per-row protected table % needs READ COMMITTED', TG_RELID::regclass
            USING ERRCODE = '0A000',
                  HINT = 'under REPEATABLE READ or SERIALIZABLE the rows of resources granted after the snapshot would go unchecked: truncate under READ COMMITTED, or DELETE';
    END IF;
    EXECUTE format('SELECT array_agg(DISTINCT (%L || %I::text) COLLATE "C") FROM %s', TG_ARGV[0], TG_ARGV[2], TG_RELID::regclass) INTO rs;
    IF rs IS NOT NULL THEN
        ts := ARRAY(SELECT (reg ->> u.r)::bigint FROM unnest(rs) WITH ORDINALITY AS u(r, i) ORDER BY u.i);
        PERFORM fence._check_many(rs, ts, TG_OP, TG_RELID);
    END IF;
    RETURN NULL;
END
$function$;

CREATE OR REPLACE FUNCTION fence._floor_from_column(tbl regclass, qn text, col name)
 RETURNS void
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    floor bigint;
BEGIN
    EXECUTE format('SELECT max(%I) FROM %s', col, qn) INTO floor;
    IF floor > fence._token_floor() THEN
        IF NOT has_function_privilege('fence._raise_floor(bigint)', 'EXECUTE') THEN
            RAISE EXCEPTION 'pgfence: column % of % holds token %, above every token granted so far', col, tbl, floor
                USING ERRCODE = '42501',
                      HINT = 'the rows come from a restore or an earlier install: have the kit''s owner or an operator run this protect again, so later grants exceed them';
        END IF;
        PERFORM fence._raise_floor(floor);
    END IF;
END
$function$;

CREATE OR REPLACE FUNCTION fence.protect(tbl regclass, resource text, token_column name DEFAULT NULL::name)
 RETURNS void
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_variable
DECLARE
    qn text;
    fn regprocedure;
BEGIN
    qn := fence._owned_table(tbl, 'protect');
    PERFORM fence._check_name('resource', resource);
    PERFORM fence._protectable(tbl);
    IF token_column IS NOT NULL THEN
        PERFORM fence._check_token_column(tbl, qn, token_column);
        fn := fence._guard_function(token_column);
    END IF;
    PERFORM fence._drop_guards(tbl, qn);
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
    IF token_column IS NOT NULL THEN
        PERFORM fence._floor_from_column(tbl, qn, token_column);
    END IF;
END
$function$;

CREATE OR REPLACE FUNCTION fence.protect_rows(tbl regclass, resource_column name, resource_prefix text DEFAULT ''::text, token_column name DEFAULT NULL::name)
 RETURNS void
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_variable
DECLARE
    qn  text;
    fn  regprocedure;
    a   record;
    tc  text := coalesce(token_column, '');
BEGIN
    qn := fence._owned_table(tbl, 'protect_rows');
    IF resource_prefix IS NULL THEN
        RAISE EXCEPTION 'pgfence: resource_prefix must not be NULL' USING ERRCODE = '22004', HINT = 'pass '''' for no prefix';
    END IF;
    IF char_length(resource_prefix) > 200 THEN
        RAISE EXCEPTION 'pgfence: resource_prefix is % characters long; the limit is 200', char_length(resource_prefix)
            USING ERRCODE = '22001', HINT = 'resource names are at most 255 characters, prefix included';
    END IF;
    PERFORM fence._protectable(tbl);
    IF resource_column IS NULL THEN
        RAISE EXCEPTION 'pgfence: resource_column must not be NULL' USING ERRCODE = '22004', HINT = 'pass the column that names each row''s resource';
    END IF;
    SELECT x.atttypid, x.attnotnull, x.attgenerated INTO a FROM pg_attribute x
     WHERE x.attrelid = tbl AND x.attname = resource_column AND x.attnum > 0 AND NOT x.attisdropped;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgfence: column % of table % does not exist', resource_column, tbl
            USING ERRCODE = '42703', HINT = 'pass the column that names each row''s resource (for example its primary key)';
    END IF;
    IF a.atttypid NOT IN ('int2'::regtype::oid, 'int4'::regtype::oid, 'int8'::regtype::oid, 'text'::regtype::oid, 'varchar'::regtype::oid, 'uuid'::regtype::oid) THEN
        RAISE EXCEPTION 'pgfence: resource column % of table % has type %', resource_column, tbl, a.atttypid::regtype
            USING ERRCODE = '42804', HINT = 'use a column of type smallint, integer, bigint, text, varchar or uuid';
    END IF;
    IF a.attgenerated <> '' THEN
        RAISE EXCEPTION 'pgfence: resource column % of table % is a generated column', resource_column, tbl
            USING ERRCODE = '42809', HINT = 'BEFORE triggers see generated columns before they are computed: use a plain column';
    END IF;
    IF NOT a.attnotnull THEN
        RAISE EXCEPTION 'pgfence: resource column % of table % may be NULL', resource_column, tbl
            USING ERRCODE = '42P16', HINT = format('ALTER TABLE %s ALTER COLUMN %I SET NOT NULL', qn, resource_column);
    END IF;
    IF token_column IS NOT NULL THEN
        IF token_column = resource_column THEN
            RAISE EXCEPTION 'pgfence: the token column and the resource column of % are both %', tbl, resource_column
                USING ERRCODE = '42P16', HINT = 'keep the token in a bigint column of its own';
        END IF;
        PERFORM fence._check_token_column(tbl, qn, token_column);
    END IF;
    fn := fence._rows_function(resource_column, token_column);

    PERFORM fence._drop_guards(tbl, qn);
    IF token_column IS NOT NULL THEN
        EXECUTE format('CREATE TRIGGER "~fence_guard_0_mark" BEFORE UPDATE OF %I ON %s FOR EACH ROW EXECUTE FUNCTION %s(%L, %L, %L)',
                       token_column, qn, fn::regproc, resource_prefix, tc, resource_column);
        EXECUTE format('CREATE TRIGGER "~fence_guard_1_ins" BEFORE INSERT ON %s FOR EACH ROW WHEN (NEW.%I IS NULL) EXECUTE FUNCTION %s(%L, %L, %L)',
                       qn, token_column, fn::regproc, resource_prefix, tc, resource_column);
        EXECUTE format('CREATE TRIGGER "~fence_guard_1_row" BEFORE UPDATE ON %s FOR EACH ROW EXECUTE FUNCTION %s(%L, %L, %L)',
                       qn, fn::regproc, resource_prefix, tc, resource_column);
    END IF;
    EXECUTE format('CREATE TRIGGER "~fence_rows_2_ins" AFTER INSERT ON %s REFERENCING NEW TABLE AS fence_new FOR EACH STATEMENT EXECUTE FUNCTION %s(%L, %L, %L)',
                   qn, fn::regproc, resource_prefix, tc, resource_column);
    EXECUTE format('CREATE TRIGGER "~fence_rows_2_upd" AFTER UPDATE ON %s REFERENCING OLD TABLE AS fence_old NEW TABLE AS fence_new FOR EACH STATEMENT EXECUTE FUNCTION %s(%L, %L, %L)',
                   qn, fn::regproc, resource_prefix, tc, resource_column);
    EXECUTE format('CREATE TRIGGER "~fence_rows_2_del" AFTER DELETE ON %s REFERENCING OLD TABLE AS fence_old FOR EACH STATEMENT EXECUTE FUNCTION %s(%L, %L, %L)',
                   qn, fn::regproc, resource_prefix, tc, resource_column);
    EXECUTE format('CREATE TRIGGER "~fence_rows_3_pin" AFTER DELETE ON %s REFERENCING OLD TABLE AS fence_old FOR EACH ROW WHEN (false) EXECUTE FUNCTION %s(%L, %L, %L)',
                   qn, fn::regproc, resource_prefix, tc, resource_column);
    EXECUTE format('CREATE TRIGGER zz_fence_guard_stmt BEFORE TRUNCATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION fence._rows_truncate(%L, %L, %L)',
                   qn, resource_prefix, tc, resource_column);
    IF token_column IS NOT NULL THEN
        PERFORM fence._floor_from_column(tbl, qn, token_column);
    END IF;
END
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
        fence._guard_function(name), fence._rows_function(name, name), fence._token_floor(), fence._guard_triggers(regclass),
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

CREATE OR REPLACE FUNCTION fence._token_floor()
 RETURNS bigint
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
    SELECT (fence._epoch() << 43) | (SELECT s.last_value - CASE WHEN s.is_called THEN 0 ELSE 1 END FROM fence.token_counter s)
$function$;

DROP FUNCTION fence._guard_function(regclass, name);
DROP FUNCTION fence._rows_function(regclass, name, name);
CREATE OR REPLACE FUNCTION fence._guard_function(col name)
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
$function$;

CREATE OR REPLACE FUNCTION fence._rows_function(rcol name, tcol name)
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
    PERFORM pg_advisory_xact_lock(fence._gate_key('guard function ' || fname));
    fn := to_regprocedure(format('fence.%I()', fname));
    IF fn IS NULL THEN
        EXECUTE format('CREATE FUNCTION fence.%I() RETURNS trigger LANGUAGE plpgsql VOLATILE AS %L', fname, fence._rows_source(rcol, tcol));
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

DO $$
DECLARE
    g  record;
    pt record;
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
    FOR pt IN SELECT t.tgrelid::pg_catalog.regclass AS tbl, t.tgfoid::pg_catalog.regproc AS fn, t.tgenabled,
                    fence._trigger_arg(t.tgargs, 0) AS pre, fence._trigger_arg(t.tgargs, 1) AS tc, fence._trigger_arg(t.tgargs, 2) AS rc
               FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid
              WHERE t.tgname = '~fence_rows_3_pin' AND pg_catalog.pg_has_role(current_user, c.relowner, 'USAGE') LOOP
        EXECUTE pg_catalog.format('DROP TRIGGER "~fence_rows_3_pin" ON %s', pt.tbl);
        EXECUTE pg_catalog.format('CREATE TRIGGER "~fence_rows_3_pin" AFTER DELETE ON %s REFERENCING OLD TABLE AS fence_old FOR EACH ROW WHEN (false) EXECUTE FUNCTION %s(%L, %L, %L)',
                                  pt.tbl, pt.fn, pt.pre, pt.tc, pt.rc);
        IF pt.tgenabled = 'A' THEN
            EXECUTE pg_catalog.format('ALTER TABLE %s ENABLE ALWAYS TRIGGER "~fence_rows_3_pin"', pt.tbl);
        END IF;
    END LOOP;
END
$$;

DROP VIEW fence.protected;
CREATE VIEW fence.protected AS
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
       (max(fence._trigger_arg(t.tgargs, 2)) FILTER (WHERE t.tgname = '~fence_rows_2_upd'))::name AS resource_column
  FROM pg_catalog.pg_trigger t
 WHERE t.tgname IN ('zz_fence_guard_row', '~fence_guard_1_row', 'zz_fence_guard_stmt', '~fence_rows_2_upd')
   AND t.tgfoid IN (SELECT p.oid FROM pg_catalog.pg_proc p WHERE p.pronamespace = 'fence'::pg_catalog.regnamespace)
 GROUP BY t.tgrelid, fence._trigger_arg(t.tgargs, 0);
COMMENT ON VIEW fence.protected IS
    'every table guarded by fence.protect (form table: resource) or fence.protect_rows (form rows: resource is the prefix, resource_column names the rest), its token column (NULL: fence.use_token), and the roles other than the owner that can create triggers on it';

DROP FUNCTION fence.fire_always(regclass, boolean);
DROP FUNCTION fence._pin_condition(name, name);
DROP FUNCTION fence._guard_maker(regclass);
DROP FUNCTION fence._cache_epoch(fence.epoch_cache);
DROP FUNCTION fence._acting_role_check(oid);
DROP FUNCTION fence._acting_role();
DROP FUNCTION fence._database_oid();
DROP TRIGGER origin_changed ON fence.origin;
DROP FUNCTION fence._origin_changed();
DROP TABLE fence.epoch_cache;
DROP TABLE fence.commit_flush;
DROP TABLE fence.origin;

CREATE OR REPLACE FUNCTION fence.version() RETURNS integer
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT 6 $$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA fence FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA fence FROM PUBLIC;

SELECT fence._regrant_usage();
