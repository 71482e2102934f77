// Package integration holds pgfence's fault tests: they run the kit on
// private PostgreSQL clusters (internal/pgtest.NewCluster) and check
// guarantee 1 of the contract, "for every resource, each grant returns a
// token strictly larger than every token granted before for that resource",
// across server crash and restart, promotion of an asynchronous standby that
// never received the last grants, dump and restore into a fresh cluster, and
// a crash in the middle of concurrent grants.
//
// The package has no non-test code. The tests need local PostgreSQL server
// binaries (initdb, pg_ctl, pg_dump, pg_restore) and are skipped without
// them (failed under PGFENCE_TEST_REQUIRE_DB=1).
package integration
