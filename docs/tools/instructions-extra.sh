#!/usr/bin/env bash
# instructions-extra.sh: ../shared/tools/instructions.sh with scenarios of one's own, for measurements
# the shared tool does not make (issue 20's floors and C prototype; docs/benchmarks.md "Floors").
#
#   EXTRA="sql files" SCEN="scenario files" ONLY="scenario names" docs/tools/instructions-extra.sh [MIGRATIONS_DIR]
#
# The fixture, the method and the built-in scenarios are the shared tool's (its header says how it
# counts); then each EXTRA file is run by psql on the fixture database (the variable :tok is the
# table-wide resource 'tw''s token; the tables toks, hand and the kit's leases exist), and each SCEN
# file is sourced by bash to add scenarios with the shared tool's own helpers:
#   scen NAME "PREPARE ..." "EXECUTE ...;"   one statement (or transaction) run 100 and 200 times
#   mk NAME N "PREPARE ..." "EXECUTE ...;"   for bulk scenarios, N = 4 and 8
# ($T is 'tw''s token, $P the token of resource row:1.) ONLY lists the scenarios to report (default:
# the shared tool's); each is divided into its reference: bulk-plain for names starting with bulk,
# grant-hand for names starting with grant, plain-ins and plain-del for names ending in -ins and -del,
# plain for the others; list a reference before the scenarios it divides, or it is counted in a run
# of its own after their runs have changed the tables.
#
#   EXTRA=docs/tools/insert-delete.sql SCEN=docs/tools/insert-delete.scen \
#     ONLY="plain-ins tw-ins rows-ins plain-del tw-del rows-del" docs/tools/instructions-extra.sh migrations
#   EXTRA=docs/tools/floors.sql SCEN=docs/tools/floors.scen \
#     ONLY="plain empty-trig floor-tw floor-gate floor-sound table-wide plain-10k floor-rows per-row floor-ut use-token grant-hand grant-floor grant" \
#     docs/tools/instructions-extra.sh migrations
#   (cd docs/tools/cguard && make && make install)   # needs postgresql-server-dev-15; a prototype, never shipped
#   EXTRA=docs/tools/cguard/cguard.sql SCEN=docs/tools/cguard/cguard.scen \
#     ONLY="plain two-stmt-plain c-tw c-ut c-ut-kit plain-cpr0 c-rows bulk-plain bulk-c-rows" docs/tools/instructions-extra.sh migrations
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
q "insert into hand select 'g' || g, 'cg', g, now() from generate_series(1, 1000) g" >/dev/null
for f in ${EXTRA:-}; do psql -X -q -h "$W" -p $PORT -U postgres -d cg -v ON_ERROR_STOP=1 -v tok=$T -f "$f" >/dev/null; done
q "vacuum analyze" >/dev/null
P=$(q "select tok from toks where id = 1")
AS "$B/pg_ctl" -D "$W/data" -w -m fast stop >/dev/null
mk() { # name N prepare-statements execute-lines
  { printf '%s\n' "$3"; for i in $(seq 1 $((10 + $2))); do printf '%s\n' "$4"; done; } > "$W/$1.$2.sql"
}
scen() { # name prepare execute
  mk "$1" 100 "$2" "$3"; mk "$1" 200 "$2" "$3"
}
scen plain "PREPARE u AS UPDATE plain SET v = v + 1, tok = 1 WHERE id = 1;" "EXECUTE u;"
scen empty-trig "PREPARE u AS UPDATE etrig SET v = v + 1, tok = 1 WHERE id = 1;" "EXECUTE u;"
scen table-wide "PREPARE u AS UPDATE tw SET v = v + 1, tok = $T WHERE id = 1;" "EXECUTE u;"
scen use-token "PREPARE c AS SELECT fence.use_token('tw', $T); PREPARE u AS UPDATE ut SET v = v + 1 WHERE id = 1;" "BEGIN; EXECUTE c; EXECUTE u; COMMIT;"
scen per-row "PREPARE u AS UPDATE pr SET v = v + 1, tok = $P WHERE id = 1;" "EXECUTE u;"
scen grant "PREPARE a AS SELECT fence.release(r, fence.acquire(r, 'cg', '30 seconds')) FROM (SELECT 'g' || (1 + (random() * 999)::int) AS r) s;" "EXECUTE a;"
scen grant-hand "PREPARE a AS WITH k AS (SELECT 'g' || (1 + (random() * 999)::int) AS r), ins AS (INSERT INTO hand AS l (resource, holder, token, expires_at) SELECT r, 'cg', nextval('hand_seq'), clock_timestamp() + interval '30 seconds' FROM k ON CONFLICT (resource) DO UPDATE SET holder = excluded.holder, token = excluded.token, expires_at = excluded.expires_at WHERE l.expires_at < clock_timestamp() RETURNING l.resource, l.token) UPDATE hand h SET expires_at = clock_timestamp() FROM ins WHERE h.resource = ins.resource AND h.token = ins.token;" "EXECUTE a;"
# bulk: N = 4 and 8 statements of 10 000 rows
for n in 4 8; do
  mk bulk-plain $n "PREPARE u AS UPDATE bplain SET v = bplain.v + 1, tok = t.tok FROM toks t WHERE t.id = bplain.id;" "EXECUTE u;"
  mk bulk-rows $n "PREPARE u AS UPDATE pr SET v = pr.v + 1, tok = t.tok FROM toks t WHERE t.id = pr.id;" "EXECUTE u;"
done
[ "$(id -u)" = 0 ] && chown -R postgres "$W"
ir() { # name n -> total instructions
  AS valgrind --tool=callgrind --callgrind-out-file="$W/cg.$1.$2.out" "$B/postgres" --single -D "$W/data" \
     -c synchronous_commit=off -c fsync=off -c autovacuum=off cg < "$W/$1.$2.sql" > "$W/$1.$2.log" 2>&1
  if grep -q 'ERROR' "$W/$1.$2.log"; then echo "instructions: scenario $1 failed: $(grep -m1 ERROR "$W/$1.$2.log")" >&2; exit 1; fi
  grep -E '^(summary|totals):' "$W/cg.$1.$2.out" | head -1 | awk '{print $2}'
}
per() { local a b; a=$(ir "$1" "$2"); b=$(ir "$1" "$3"); echo $(( (b - a) / ($3 - $2) )); }
for f in ${SCEN:-}; do . "$f"; done
[ "$(id -u)" = 0 ] && chown -R postgres "$W"
printf '%-16s %14s %10s\n' scenario 'instr/stmt' 'ref/this'
declare -A ref
for s in ${ONLY:-plain empty-trig table-wide use-token per-row bulk-plain bulk-rows grant-hand grant}; do
  n1=100; n2=200
  case $s in bulk*) n1=4; n2=8; r=bulk-plain;; grant*) r=grant-hand;; *-ins) r=plain-ins;; *-del) r=plain-del;; *) r=plain;; esac
  [ -f "$W/$s.$n1.sql" ] || { echo "no scenario $s" >&2; continue; }
  v=$(per $s $n1 $n2)
  # a reference counts once: its own figure when it is listed, else a run of its own
  if [ "$s" = "$r" ]; then ref[$r]=$v; elif [ -z "${ref[$r]:-}" ]; then ref[$r]=$(per $r $n1 $n2); fi
  printf '%-16s %14s %10.3f\n' "$s" "$v" "$(echo "${ref[$r]} / $v" | bc -l)"
done
