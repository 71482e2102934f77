create table ftw(id int primary key, v bigint not null default 0, tok bigint) with (fillfactor=50);
create table fgw(id int primary key, v bigint not null default 0, tok bigint) with (fillfactor=50);
create table fut(id int primary key, v bigint not null default 0) with (fillfactor=50);
insert into ftw select g,0,:tok from generate_series(1,100) g;
insert into fgw select g,0,:tok from generate_series(1,100) g;
insert into fut select g,0 from generate_series(1,100) g;
-- the least a table-wide guard must do: read the lease row, compare
create function floor_trg() returns trigger language plpgsql as $$
DECLARE t bigint;
BEGIN
  SELECT l.token INTO t FROM fence.lease l WHERE l.resource = TG_ARGV[0];
  IF t IS DISTINCT FROM NEW.tok THEN RAISE EXCEPTION 'stale'; END IF;
  RETURN NEW;
END $$;
create trigger f before insert or update or delete on ftw for each row execute function floor_trg('tw');
-- the same plus the gate the kit takes (shared advisory lock in a subtransaction)
create function floor_gate_trg() returns trigger language plpgsql as $$
DECLARE t bigint; ok bool;
BEGIN
  BEGIN ok := pg_try_advisory_xact_lock_shared(42); EXCEPTION WHEN OTHERS THEN RAISE; END;
  SELECT l.token INTO t FROM fence.lease l WHERE l.resource = TG_ARGV[0];
  IF t IS DISTINCT FROM NEW.tok THEN RAISE EXCEPTION 'stale'; END IF;
  RETURN NEW;
END $$;
create trigger f before insert or update or delete on fgw for each row execute function floor_gate_trg('tw');
-- use_token floor: a function that checks and sets the setting, a trigger that reads it and checks again
create function floor_use(r text, t bigint) returns void language plpgsql as $$
DECLARE c bigint;
BEGIN
  SELECT l.token INTO c FROM fence.lease l WHERE l.resource = r;
  IF c IS DISTINCT FROM t THEN RAISE EXCEPTION 'stale'; END IF;
  PERFORM set_config('floor.tok', t::text, true);
END $$;
create function floor_ut_trg() returns trigger language plpgsql as $$
DECLARE t bigint;
BEGIN
  SELECT l.token INTO t FROM fence.lease l WHERE l.resource = TG_ARGV[0];
  IF t IS DISTINCT FROM current_setting('floor.tok')::bigint THEN RAISE EXCEPTION 'stale'; END IF;
  RETURN NEW;
END $$;
create trigger f before insert or update or delete on fut for each row execute function floor_ut_trg('tw');
-- grant floor: the hand-written pair, each in a PL/pgSQL function
create function floor_acquire(r text) returns bigint language plpgsql as $$
DECLARE t bigint;
BEGIN
  INSERT INTO hand AS l (resource, holder, token, expires_at) VALUES (r, 'cg', nextval('hand_seq'), clock_timestamp() + interval '30 seconds')
    ON CONFLICT (resource) DO UPDATE SET holder = excluded.holder, token = excluded.token, expires_at = excluded.expires_at
    WHERE l.expires_at < clock_timestamp() RETURNING l.token INTO t;
  RETURN t;
END $$;
create function floor_release(r text, t bigint) returns bool language plpgsql as $$
BEGIN
  UPDATE hand h SET expires_at = clock_timestamp() WHERE h.resource = r AND h.token = t;
  RETURN FOUND;
END $$;
-- the least sound table-wide guard: a mark trigger telling an assigned token from a carried one, the gate, the acting role, the lookup
create table fsw(id int primary key, v bigint not null default 0, tok bigint) with (fillfactor=50);
insert into fsw select g,0,:tok from generate_series(1,100) g;
create function floor_mark() returns trigger language plpgsql as $$
BEGIN NEW.tok := -NEW.tok; RETURN NEW; END $$;
create function floor_sound() returns trigger language plpgsql as $$
DECLARE t bigint; ok bool; tok bigint := -NEW.tok;
BEGIN
  BEGIN ok := pg_try_advisory_xact_lock_shared(42); EXCEPTION WHEN OTHERS THEN RAISE; END;
  SELECT l.token = tok AND CURRENT_USER = fence._acting_role() INTO ok FROM fence.lease l WHERE l.resource = TG_ARGV[0];
  IF ok IS NOT TRUE THEN RAISE EXCEPTION 'stale'; END IF;
  NEW.tok := tok;
  RETURN NEW;
END $$;
create trigger a before update of tok on fsw for each row execute function floor_mark();
create trigger b before update on fsw for each row execute function floor_sound('tw');
-- per-row floor on a 10 000-row table like the per-row scenario's: resource from the row, gate, lookup
create table fpr(id int primary key, v bigint not null default 0, tok bigint) with (fillfactor=50);
insert into fpr select id, 0, tok from toks;
create table fpr0(id int primary key, v bigint not null default 0, tok bigint) with (fillfactor=50);
insert into fpr0 select id, 0, tok from toks;
create function floor_rows() returns trigger language plpgsql as $$
DECLARE t bigint; ok bool; r text := TG_ARGV[0] || NEW.id;
BEGIN
  BEGIN ok := pg_try_advisory_xact_lock_shared(hashtext(r)); EXCEPTION WHEN OTHERS THEN RAISE; END;
  SELECT l.token INTO t FROM fence.lease l WHERE l.resource = r;
  IF t IS DISTINCT FROM NEW.tok THEN RAISE EXCEPTION 'stale'; END IF;
  RETURN NEW;
END $$;
create trigger f before update on fpr for each row execute function floor_rows('row:');
