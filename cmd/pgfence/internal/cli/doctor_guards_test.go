package cli_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// doctorList runs doctor --json and returns the findings of one check.
func doctorList(t *testing.T, url, check string) []finding {
	t.Helper()
	_, out, errOut := run(t, "doctor", "--json", "--database-url", url)
	var fs []finding
	require.NoError(t, json.Unmarshal([]byte(out), &fs), "stdout %q stderr %q", out, errOut)
	var got []finding
	for _, f := range fs {
		if f.Check == check {
			got = append(got, f)
		}
	}
	return got
}

// guardFindings is doctor's "protected tables" findings, one line each:
// status, detail, " | ", fix.
func guardFindings(t *testing.T, url string) string {
	t.Helper()
	var lines []string
	for _, f := range doctorList(t, url, "protected tables") {
		lines = append(lines, f.Status+" "+f.Detail+" | "+f.Fix)
	}
	return strings.Join(lines, "\n")
}

// TestDoctorReportsWhatGetsAroundTheGuards: roles other than the owner with
// TRIGGER on a protected table, a table still on migration 2's guard, and a
// disabled guard trigger (of either form) are each reported with the fix; a
// clean table is ok.
func TestDoctorReportsWhatGetsAroundTheGuards(t *testing.T) {
	t.Parallel()
	db := pgtest.Setup(t)
	ctx := t.Context()
	exec := func(sql string) {
		t.Helper()
		_, err := db.Pool.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	for _, tbl := range []string{"clean", "granted", "legacy", "off"} {
		exec(`CREATE TABLE ` + tbl + ` (id int, tok bigint)`)
		require.NoError(t, sqlfuncs.Protect(ctx, db.Pool, tbl, "r", "tok"))
	}
	etl := pgtest.NewRole(t, "etl")
	exec(`GRANT ALL ON granted TO ` + pgx.Identifier{etl}.Sanitize())
	// migration 2's trigger, as a table keeps it when migration 3 could not
	// re-create its guards
	exec(`SELECT fence.unprotect('legacy')`)
	exec(`CREATE TRIGGER zz_fence_guard_row AFTER INSERT OR UPDATE OR DELETE ON legacy FOR EACH ROW EXECUTE FUNCTION fence._guard_row('r', 'tok')`)
	exec(`ALTER TABLE off DISABLE TRIGGER "~fence_guard_1_row"`)
	exec(`CREATE TABLE rowsoff (id int NOT NULL, tok bigint)`)
	require.NoError(t, sqlfuncs.ProtectRows(ctx, db.Pool, "rowsoff", "id", "r:", "tok"))
	exec(`ALTER TABLE rowsoff DISABLE TRIGGER "~fence_guard_1_row"`)

	all := guardFindings(t, db.URL)
	require.Contains(t, all, "warn roles other than the owner can create triggers on granted: "+etl)
	require.Contains(t, all, "REVOKE TRIGGER ON granted FROM "+etl)
	require.Contains(t, all, "warn legacy keeps the guard of migration 2")
	require.Contains(t, all, "SELECT fence.protect('legacy', 'r', 'tok')")
	require.Contains(t, all, "fail a guard trigger of off is disabled")
	require.Contains(t, all, "ALTER TABLE off ENABLE TRIGGER USER (or SELECT fence.protect again)")
	require.Contains(t, all, "fail a guard trigger of rowsoff is disabled")
	require.Contains(t, all, "ALTER TABLE rowsoff ENABLE TRIGGER USER (or SELECT fence.protect_rows again)")
	require.Contains(t, all, "ok 1 of 5 with the current guard")
}

// TestDoctorWarnsOfTwoPromotionsWithoutAnArchive: a primary with a standby
// and no WAL archive is the setup in which two standbys promoted one after
// the other take the same timeline (integration/split_promotion_test.go
// shows the duplicate tokens); doctor says so on the primary, and not on a
// server without standbys.
func TestDoctorWarnsOfTwoPromotionsWithoutAnArchive(t *testing.T) {
	t.Parallel()
	primary := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	fs := doctorList(t, primary.URL(), "promotion")
	require.Len(t, fs, 1)
	require.Equal(t, "ok", fs[0].Status, fs[0].Detail)
	standby := primary.NewStandby(t)
	primary.WaitCaughtUp(t, standby)
	fs = doctorList(t, primary.URL(), "promotion")
	require.Len(t, fs, 1)
	require.Equal(t, "warn", fs[0].Status)
	require.Contains(t, fs[0].Detail, "no WAL archive and 1 standby(s) connected")
	require.Contains(t, fs[0].Fix, "archive WAL")
}

// TestDoctorReportsGuardsThatReplicaModeSkips (issue 19, item 4): once a
// role other than a superuser may set session_replication_role (GRANT SET
// ON PARAMETER, PostgreSQL 15+), a session of that role in replica mode
// skips every guard trigger that does not fire always; doctor names the
// tables of either form whose guards do not, with fence.fire_always as the
// fix, and stops once they do.
func TestDoctorReportsGuardsThatReplicaModeSkips(t *testing.T) {
	t.Parallel()
	// A cluster of its own: a parameter's privileges hold for every database
	// of the server, and would show in the doctor tests of others.
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, c.URL())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	var version int
	require.NoError(t, conn.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version))
	if version < 150000 {
		t.Skip("parameter privileges exist from PostgreSQL 15 on; before, only superusers choose replica mode")
	}
	exec := func(sql string) {
		t.Helper()
		_, err := conn.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	exec(`CREATE TABLE wide (id int, tok bigint)`)
	require.NoError(t, sqlfuncs.Protect(ctx, conn, "wide", "r", "tok"))
	exec(`CREATE TABLE perrow (id int NOT NULL, tok bigint)`)
	require.NoError(t, sqlfuncs.ProtectRows(ctx, conn, "perrow", "id", "r:", "tok"))
	text := func() string { return guardFindings(t, c.URL()) }
	require.NotContains(t, text(), "session_replication_role", "nobody but superusers may choose replica mode")

	const loader = "loader"
	exec(`CREATE ROLE ` + loader)
	exec(`GRANT SET ON PARAMETER session_replication_role TO ` + loader)
	all := text()
	for _, tbl := range []string{"wide", "perrow"} {
		require.Contains(t, all, "warn "+loader+" may set session_replication_role = replica, and then the guards of "+tbl+" do not fire")
		require.Contains(t, all, "SELECT fence.fire_always('"+tbl+"')")
	}
	require.NoError(t, sqlfuncs.FireAlways(ctx, conn, "wide", true))
	require.NoError(t, sqlfuncs.FireAlways(ctx, conn, "perrow", true))
	require.NotContains(t, text(), "session_replication_role")
}

// TestDoctorReportsGuardsThatFireInReplicaModeOnly: a guard trigger set to
// fire in replica mode only (ALTER TABLE ... ENABLE REPLICA TRIGGER) is
// skipped by every ordinary session, so a write without a token commits;
// fence.protected counts such a table as not enabled (since migration 8;
// 7 counted it as enabled), and doctor fails it
// with the fix, for either form, until the guards are re-created.
func TestDoctorReportsGuardsThatFireInReplicaModeOnly(t *testing.T) {
	t.Parallel()
	db := pgtest.Setup(t)
	ctx := t.Context()
	exec := func(sql string) {
		t.Helper()
		_, err := db.Pool.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	exec(`CREATE TABLE wide (id int, tok bigint)`)
	require.NoError(t, sqlfuncs.Protect(ctx, db.Pool, "wide", "r", "tok"))
	exec(`CREATE TABLE perrow (id int NOT NULL, tok bigint)`)
	require.NoError(t, sqlfuncs.ProtectRows(ctx, db.Pool, "perrow", "id", "r:", "tok"))
	exec(`ALTER TABLE wide ENABLE REPLICA TRIGGER "~fence_guard_1_row"`)
	exec(`ALTER TABLE perrow ENABLE REPLICA TRIGGER "~fence_guard_1_row"`)

	exec(`INSERT INTO wide VALUES (1, NULL)`) // no token, and accepted
	var enabled bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT enabled FROM fence.protected WHERE tbl = 'wide'::regclass`).Scan(&enabled))
	require.False(t, enabled, "fence.protected (since 008) counts a replica-only guard as not enabled")

	text := func() string { return guardFindings(t, db.URL) }
	all := text()
	require.Contains(t, all, "fail a guard trigger of wide fires in replica mode only (ENABLE REPLICA TRIGGER): ordinary sessions skip it")
	require.Contains(t, all, "as the owner of wide: SELECT fence.protect again")
	require.Contains(t, all, "fail a guard trigger of perrow fires in replica mode only")
	require.Contains(t, all, "as the owner of perrow: SELECT fence.protect_rows again")
	require.NotContains(t, all, "ok ")

	require.NoError(t, sqlfuncs.Protect(ctx, db.Pool, "wide", "r", "tok"))
	require.NoError(t, sqlfuncs.ProtectRows(ctx, db.Pool, "perrow", "id", "r:", "tok"))
	require.Equal(t, "ok 2 of 2 with the current guard, no trigger roles but the owner | ", text())
	_, err := db.Pool.Exec(ctx, `INSERT INTO wide VALUES (2, NULL)`)
	require.ErrorIs(t, sqlfuncs.Translate(err), sqlfuncs.ErrNoToken)
}

// TestDoctorWarnsOfAProtectedPartitionWithUnprotectedSiblings: a row moved
// into a protected partition from an unprotected sibling keeps the token it
// carries (docs/security.md, Known limits;
// TestRedteam8RowMovedIntoAProtectedPartition), so doctor names the
// siblings; once they are protected too, the warning goes.
func TestDoctorWarnsOfAProtectedPartitionWithUnprotectedSiblings(t *testing.T) {
	t.Parallel()
	db := pgtest.Setup(t)
	ctx := t.Context()
	exec := func(sql string) {
		t.Helper()
		_, err := db.Pool.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	// fence.protect refuses partitions: a table is protected, then attached
	exec(`CREATE TABLE items (id int NOT NULL, k int NOT NULL, tok bigint) PARTITION BY RANGE (k)`)
	exec(`CREATE TABLE items_hot (id int NOT NULL, k int NOT NULL, tok bigint)`)
	require.NoError(t, sqlfuncs.Protect(ctx, db.Pool, "items_hot", "r", "tok"))
	exec(`ALTER TABLE items ATTACH PARTITION items_hot FOR VALUES FROM (0) TO (100)`)
	exec(`CREATE TABLE items_cold PARTITION OF items FOR VALUES FROM (100) TO (200)`)
	text := func() string { return guardFindings(t, db.URL) }
	all := text()
	require.Contains(t, all, "warn items_hot is a partition whose siblings items_cold are not protected")
	require.Contains(t, all, "protect each sibling before attaching it")
	require.NotContains(t, all, "ok ")

	exec(`ALTER TABLE items DETACH PARTITION items_cold`)
	require.NoError(t, sqlfuncs.Protect(ctx, db.Pool, "items_cold", "r", "tok"))
	exec(`ALTER TABLE items ATTACH PARTITION items_cold FOR VALUES FROM (100) TO (200)`)
	require.Equal(t, "ok 2 of 2 with the current guard, no trigger roles but the owner | ", text())
}
