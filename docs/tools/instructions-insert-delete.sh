#!/usr/bin/env bash
# instructions-insert-delete.sh (INSERT and DELETE scenarios of the shared instructions.sh; run: docs/tools/instructions-insert-delete.sh migrations): what the kit's guards and grants cost in CPU instructions (valgrind's callgrind), per
# statement, against the same statement without the kit. Instruction counts do not move with the load of
# the machine, so two runs of the same migrations give the same figures (within ~1 %), and a change to a
# guard can be judged in one run on a busy 2-core machine.
#
#   ../shared/tools/instructions.sh [MIGRATIONS_DIR]      (default: ./migrations)
#
# How: a throwaway cluster (PostgreSQL 15 from /usr/lib/postgresql/15/bin, or PGBIN), the migrations applied
# file by file, fixtures made through the kit's own functions; then, per scenario, a single-user backend
# (postgres --single, no client, no network) under callgrind runs a prepared statement N and 2N times, each
# EXECUTE its own transaction, synchronous_commit=off, fsync=off; the difference / N is the cost of one
# statement, start-up excluded. Needs valgrind (apt-get install valgrind); takes about two minutes.
#
# Scenarios (the fixture of ../shared/tools/instructions.sh, plus six tables):
#   plain-ins    INSERT of a new row (id from a sequence) into an unprotected table (the reference)
#   tw-ins       the same into a table of fence.protect(tbl, 'tw', 'tok'), token assigned
#   rows-ins     the same into a table of fence.protect_rows(tbl, 'r', 'row:', 'tok'), one resource
#   plain-del    BEGIN; DELETE one row by primary key; COMMIT (the reference)
#   tw-del       BEGIN; fence.use_token; DELETE one row of the table-wide table; COMMIT
#   rows-del     BEGIN; fence.use_token; DELETE one row of the per-row table; COMMIT
# The fixture's other scenarios are not run here (instructions.sh has them).
set -eu
MIG=$(cd "${1:-migrations}" && pwd)
B=${PGBIN:-/usr/lib/postgresql/15/bin}
command -v valgrind >/dev/null || { echo "instructions: valgrind is not installed (apt-get install valgrind)" >&2; exit 2; }
W=$(mktemp -d /tmp/instructions.XXXXXX); chmod 755 "$W"
AS() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
[ "$(id -u)" = 0 ] && chown postgres "$W"
PORT=$((20000 + RANDOM % 20000))
cleanup() { AS "$B/pg_ctl" -D "$W/data" -m immediate stop >/dev/null 2>&1 || true; rm -rf "$W"; }
trap cleanup EXIT
AS "$B/initdb" -D "$W/data" -A trust -U postgres >/dev/null
AS "$B/pg_ctl" -D "$W/data" -w -l "$W/log" -o "-p $PORT -k $W -c listen_addresses=''" start >/dev/null
q() { psql -X -q -At -h "$W" -p $PORT -U postgres -d cg -v ON_ERROR_STOP=1 -c "$1"; }
psql -X -q -h "$W" -p $PORT -U postgres -d postgres -c "create database cg"
for f in "$MIG"/[0-9]*.up.sql; do psql -X -q -h "$W" -p $PORT -U postgres -d cg -v ON_ERROR_STOP=1 -1 -f "$f" >/dev/null; done
T=$(q "select fence.acquire('tw','cg','10 hours')")
q "create table plain(id int primary key, v bigint not null default 0, tok bigint) with (fillfactor=50);
   create table etrig(id int primary key, v bigint not null default 0, tok bigint) with (fillfactor=50);
   create table tw(id int primary key, v bigint not null default 0, tok bigint) with (fillfactor=50);
   create table ut(id int primary key, v bigint not null default 0) with (fillfactor=50);
   create table pr(id int primary key, v bigint not null default 0, tok bigint) with (fillfactor=50);
   create table bplain(id int primary key, v bigint not null default 0, tok bigint) with (fillfactor=50);
   create table toks(id int primary key, tok bigint not null);
   create table hand(resource text primary key, holder text, token bigint not null, expires_at timestamptz not null);
   create sequence hand_seq;
   create function empty_trg() returns trigger language plpgsql as 'BEGIN RETURN NEW; END';
   create trigger e before insert or update or delete on etrig for each row execute function empty_trg();
   insert into plain select g,0,1 from generate_series(1,100) g;
   insert into etrig select g,0,1 from generate_series(1,100) g;
   select fence.protect('tw','tw','tok');
   select fence.protect('ut','tw');
   select fence.protect_rows('pr','id','row:','tok');" >/dev/null
q "begin; select fence.use_token('tw', $T); insert into tw select g,0,$T from generate_series(1,100) g; insert into ut select g,0 from generate_series(1,100) g; commit;" >/dev/null
for s in $(seq 1 250 10000); do q "insert into toks select g, fence.acquire('row:' || g, 'cg', '10 hours') from generate_series($s, $((s+249))) g" >/dev/null; done
q "insert into pr select id, 0, tok from toks; insert into bplain select id, 0, tok from toks;" >/dev/null
for s in $(seq 1 250 1000); do q "select count(fence.release('g' || g, fence.acquire('g' || g, 'cg', '1 minute'))) from generate_series($s, $((s+249))) g" >/dev/null; done
q "insert into hand select 'g' || g, 'cg', g, now() from generate_series(1, 1000) g" >/dev/null; q "vacuum analyze" >/dev/null
P=$(q "select tok from toks where id = 1")
q "create table pi(id int primary key, v bigint not null default 0, tok bigint);
   create table ti(id int primary key, v bigint not null default 0, tok bigint);
   create table ri(id int primary key, r int not null, v bigint not null default 0, tok bigint);
   create table pd(id int primary key, v bigint not null default 0, tok bigint);
   create table td(id int primary key, v bigint not null default 0, tok bigint);
   create table rd(id int primary key, r int not null, v bigint not null default 0, tok bigint);
   create sequence si start 1000000; create sequence sp; create sequence st; create sequence sr;
   select fence.protect('ti','tw','tok'); select fence.protect('td','tw','tok');
   select fence.protect_rows('ri','r','row:','tok'); select fence.protect_rows('rd','r','row:','tok');" >/dev/null
q "insert into pd select g,0,1 from generate_series(1,1000) g; insert into td select g,0,$T from generate_series(1,1000) g;
   insert into rd select g,1,0,$P from generate_series(1,1000) g" >/dev/null; q "vacuum analyze" >/dev/null
AS "$B/pg_ctl" -D "$W/data" -w -m fast stop >/dev/null
mk() { # name N prepare-statements execute-lines
  { printf '%s\n' "$3"; for i in $(seq 1 $((10 + $2))); do printf '%s\n' "$4"; done; } > "$W/$1.$2.sql"
}
scen() { # name prepare execute
  mk "$1" 100 "$2" "$3"; mk "$1" 200 "$2" "$3"
}
scen plain-ins "PREPARE u AS INSERT INTO pi VALUES (nextval('si'), 0, 1);" "EXECUTE u;"
scen tw-ins "PREPARE u AS INSERT INTO ti VALUES (nextval('si'), 0, $T);" "EXECUTE u;"
scen rows-ins "PREPARE u AS INSERT INTO ri VALUES (nextval('si'), 1, 0, $P);" "EXECUTE u;"
scen plain-del "PREPARE d AS DELETE FROM pd WHERE id = (SELECT nextval('sp'));" "BEGIN; EXECUTE d; COMMIT;"
scen tw-del "PREPARE c AS SELECT fence.use_token('tw', $T); PREPARE d AS DELETE FROM td WHERE id = (SELECT nextval('st'));" "BEGIN; EXECUTE c; EXECUTE d; COMMIT;"
scen rows-del "PREPARE c AS SELECT fence.use_token('row:1', $P); PREPARE d AS DELETE FROM rd WHERE id = (SELECT nextval('sr'));" "BEGIN; EXECUTE c; EXECUTE d; COMMIT;"
[ "$(id -u)" = 0 ] && chown -R postgres "$W"
ir() { # name n -> total instructions
  AS valgrind --tool=callgrind --callgrind-out-file="$W/cg.$1.$2.out" "$B/postgres" --single -D "$W/data" \
     -c synchronous_commit=off -c fsync=off -c autovacuum=off cg < "$W/$1.$2.sql" > "$W/$1.$2.log" 2>&1
  if grep -q 'ERROR' "$W/$1.$2.log"; then echo "instructions: scenario $1 failed: $(grep -m1 ERROR "$W/$1.$2.log")" >&2; exit 1; fi
  grep -E '^(summary|totals):' "$W/cg.$1.$2.out" | head -1 | awk '{print $2}'
}
per() { local a b; a=$(ir "$1" "$2"); b=$(ir "$1" "$3"); echo $(( (b - a) / ($3 - $2) )); }
printf '%-12s %14s %10s\n' scenario 'instr/stmt' 'ref/this'
pi=$(per plain-ins 100 200); printf '%-12s %14s %10s\n' plain-ins "$pi" 1.000
for s in tw-ins rows-ins; do v=$(per $s 100 200); printf '%-12s %14s %10.3f\n' "$s" "$v" "$(echo "$pi / $v" | bc -l)"; done
pd=$(per plain-del 100 200); printf '%-12s %14s %10s\n' plain-del "$pd" 1.000
for s in tw-del rows-del; do v=$(per $s 100 200); printf '%-12s %14s %10.3f\n' "$s" "$v" "$(echo "$pd / $v" | bc -l)"; done
