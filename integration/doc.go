// Package integration holds pgfence's tests of whole servers and whole runs:
// what the SQL kit and gofence guarantee when the server crashes, is
// promoted, dumped and restored, re-installed or upgraded, and under long
// randomized, sustained and hostile workloads. The package has no non-test
// code.
//
// Guarantee 1 of the contract, "for every resource, each grant returns a
// token strictly larger than every token granted before for that resource",
// on private clusters (internal/pgtest.NewCluster):
//
//   - crash_test.go: server crash and restart right after the last grant,
//     also with synchronous_commit = off and with a caller who turns it off
//     after the grant or plants an = operator;
//   - concurrency_test.go: a crash in the middle of concurrent grants, and
//     the real-time order of grants across sessions;
//   - promotion_test.go: promotion of an asynchronous standby that never
//     received the last grants (and stale writes refused after it);
//   - split_promotion_test.go: two standbys of one primary promoted one
//     after the other, with and without a shared WAL archive;
//   - restore_test.go (with dump_test.go's pg_dump helpers): dump and
//     restore into a fresh cluster and into the cluster it came from;
//   - reinstall_test.go: the kit removed and installed again, and a
//     data-only restore, under rows that carry tokens of the old install.
//
// Upgrades: upgrade_test.go migrates a kit at version 2, with protected
// tables of several owners in place, to 3 and back, keeping the writers'
// grants and tokens.
//
// Whole runs:
//
//   - history_test.go: a randomized workload (workers behind freezable
//     proxies, a fault injector that terminates sessions, freezes, revokes
//     and crashes the server) whose history checker_test.go judges; each
//     checker is shown to catch planted violations and unguarded tables.
//     Per-row variants: history_rows_test.go (6 resources, one or two held
//     at once) and history_large_test.go (600 resources, up to 300 held at
//     once, statements over 1-300 of them and moves between them, under
//     READ COMMITTED and REPEATABLE READ). Replay and long runs:
//     PGFENCE_CHECK_SEED, PGFENCE_CHECK_DURATION, PGFENCE_CHECK_RUN;
//   - load_test.go: sustained load through gofence with connection churn
//     (PGFENCE_LOAD_DURATION), checking the errors, the lease table's size
//     and the client's heap;
//   - fuzz_test.go: Go fuzz tests of the SQL surface with hostile input
//     (seed corpora in testdata/fuzz); every input works as documented or
//     fails with its documented SQLSTATE, and changes nothing else.
//
// invariants_test.go holds what the tests share: the token layout, the
// ledger of granted tokens they check against, and connection helpers.
//
// The cluster tests need local PostgreSQL server binaries (initdb, pg_ctl;
// pg_dump and pg_restore where a matching version exists) and are skipped
// without them (failed under PGFENCE_TEST_REQUIRE_DB=1); the others run on
// the test server of internal/pgtest.
package integration
