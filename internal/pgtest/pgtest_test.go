package pgtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func schemaExists(t *testing.T, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, schema string) bool {
	t.Helper()
	var ok bool
	err := q.QueryRow(t.Context(), "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", schema).Scan(&ok)
	require.NoError(t, err)
	return ok
}

func TestSetupIsMigrated(t *testing.T) {
	t.Parallel()
	db := pgtest.Setup(t)
	require.True(t, schemaExists(t, db.Pool, "fence"), "schema fence exists")

	var version int64
	var dirty bool
	err := db.Pool.QueryRow(t.Context(), "SELECT version, dirty FROM "+pgx.Identifier{migrations.Table}.Sanitize()).Scan(&version, &dirty)
	require.NoError(t, err)
	require.False(t, dirty)
	require.Positive(t, version)
}

func TestSetupsAreIndependent(t *testing.T) {
	t.Parallel()
	a := pgtest.Setup(t)
	b := pgtest.Setup(t)
	require.NotEqual(t, a.Name, b.Name)
	require.NotEqual(t, a.URL, b.URL)

	_, err := a.Pool.Exec(t.Context(), "CREATE TABLE only_in_a (id int)")
	require.NoError(t, err)
	var n int
	err = b.Pool.QueryRow(t.Context(), "SELECT count(*) FROM pg_class WHERE relname = 'only_in_a'").Scan(&n)
	require.NoError(t, err)
	require.Zero(t, n)

	// Extra sessions are real, separate backends.
	c1, c2 := a.Conn(t), a.Conn(t)
	var p1, p2 int
	require.NoError(t, c1.QueryRow(t.Context(), "SELECT pg_backend_pid()").Scan(&p1))
	require.NoError(t, c2.QueryRow(t.Context(), "SELECT pg_backend_pid()").Scan(&p2))
	require.NotEqual(t, p1, p2)
}

func TestEmptyHasNoSchema(t *testing.T) {
	t.Parallel()
	db := pgtest.Empty(t)
	require.False(t, schemaExists(t, db.Pool, "fence"))
}

func TestNewRoleConnects(t *testing.T) {
	t.Parallel()
	role := pgtest.NewRole(t, "pgtest_role")
	db := pgtest.Setup(t)
	_, err := db.Pool.Exec(t.Context(), "GRANT CONNECT ON DATABASE "+pgx.Identifier{db.Name}.Sanitize()+" TO "+pgx.Identifier{role}.Sanitize())
	require.NoError(t, err)

	conn, err := pgx.Connect(t.Context(), db.URLAs(role))
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var who string
	require.NoError(t, conn.QueryRow(t.Context(), "SELECT current_user").Scan(&who))
	require.Equal(t, role, who)
}

func TestURLFor(t *testing.T) {
	t.Parallel()
	got := pgtest.URLFor("postgres://u:p@h:5/a?sslmode=disable", "b")
	require.Equal(t, "postgres://u:p@h:5/b?sslmode=disable", got)
	require.Equal(t, "postgres://r@h:5/a?sslmode=disable", pgtest.URLAs("postgres://u:p@h:5/a?sslmode=disable", "r"))
}

func TestClusterImmediateStopAndStart(t *testing.T) {
	t.Parallel()
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	conn, err := pgx.Connect(t.Context(), c.URL())
	require.NoError(t, err)
	require.True(t, schemaExists(t, conn, "fence"))
	_, err = conn.Exec(t.Context(), "CREATE TABLE durable (v int); INSERT INTO durable VALUES (42)")
	require.NoError(t, err)
	_ = conn.Close(context.Background())

	port := c.Port()
	c.Stop(t, "immediate")
	c.Start(t)
	require.Equal(t, port, c.Port())

	conn, err = pgx.Connect(t.Context(), c.URL())
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var v int
	require.NoError(t, conn.QueryRow(t.Context(), "SELECT v FROM durable").Scan(&v))
	require.Equal(t, 42, v, "a committed row survives a crash")
}

func TestClusterNoMigrate(t *testing.T) {
	t.Parallel()
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{NoMigrate: true})
	conn, err := pgx.Connect(t.Context(), c.URL())
	require.NoError(t, err)
	defer conn.Close(context.Background())
	require.False(t, schemaExists(t, conn, "fence"))
}

func TestStandbyPromotion(t *testing.T) {
	t.Parallel()
	primary := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	pconn, err := pgx.Connect(t.Context(), primary.URL())
	require.NoError(t, err)
	defer pconn.Close(context.Background())
	_, err = pconn.Exec(t.Context(), "CREATE TABLE replicated (v int); INSERT INTO replicated VALUES (7)")
	require.NoError(t, err)

	standby := primary.NewStandby(t)
	require.NotEqual(t, primary.Port(), standby.Port())
	primary.WaitCaughtUp(t, standby)

	sconn, err := pgx.Connect(t.Context(), standby.URL())
	require.NoError(t, err)
	defer sconn.Close(context.Background())
	var inRecovery bool
	require.NoError(t, sconn.QueryRow(t.Context(), "SELECT pg_is_in_recovery()").Scan(&inRecovery))
	require.True(t, inRecovery)
	_, err = sconn.Exec(t.Context(), "INSERT INTO replicated VALUES (8)")
	require.Error(t, err, "a standby is read-only")

	primary.Stop(t, "immediate")
	standby.Promote(t)

	conn, err := pgx.Connect(t.Context(), standby.URL())
	require.NoError(t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(t.Context(), "INSERT INTO replicated VALUES (9)")
	require.NoError(t, err)
	var n int
	require.NoError(t, conn.QueryRow(t.Context(), "SELECT count(*) FROM replicated").Scan(&n))
	require.Equal(t, 2, n)
	var tli string
	require.NoError(t, conn.QueryRow(t.Context(), "SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)").Scan(&tli))
	require.Equal(t, "00000002", tli)
}

// A delayed direction holds every reply for the delay, in order, and counts
// the bytes it holds; the other direction stays fast, and a delay of 0 lets
// what is held go at once.
func TestProxyDelay(t *testing.T) {
	t.Parallel()
	db := pgtest.Setup(t)
	proxy := pgtest.NewProxy(t, db.URL)
	conn, err := pgx.Connect(t.Context(), proxy.URL(db.URL))
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var n int
	require.NoError(t, conn.QueryRow(t.Context(), "SELECT 1").Scan(&n))

	proxy.Delay(pgtest.ToClient, 300*time.Millisecond)
	start := time.Now()
	var sent time.Time
	// One round trip (no prepare step before it).
	require.NoError(t, conn.QueryRow(t.Context(), "SELECT clock_timestamp()", pgx.QueryExecModeExec).Scan(&sent))
	took := time.Since(start)
	require.GreaterOrEqual(t, took, 300*time.Millisecond, "the reply came early")
	require.Less(t, sent.Sub(start), 250*time.Millisecond, "the request was held too (it reached the server %s after it was sent)", sent.Sub(start))

	proxy.Delay(pgtest.ToClient, time.Hour)
	done := make(chan error, 1)
	go func() { done <- conn.QueryRow(t.Context(), "SELECT 2").Scan(&n) }()
	require.Eventually(t, func() bool { return proxy.Pending(pgtest.ToClient) > 0 }, 5*time.Second, time.Millisecond)
	require.Zero(t, proxy.Pending(pgtest.ToServer))
	proxy.Delay(pgtest.ToClient, 0)
	require.NoError(t, <-done)
	require.Equal(t, 2, n)
	require.Zero(t, proxy.Pending(pgtest.ToClient))
}

// FreezeOpen silences the connections open at the time (a call on one
// waits, without an error, until its context ends) while new connections
// work; Thaw lets the frozen ones go on.
func TestProxyFreezeOpen(t *testing.T) {
	t.Parallel()
	db := pgtest.Setup(t)
	p := pgtest.NewProxy(t, db.URL)
	ctx := t.Context()
	old, err := pgx.Connect(ctx, p.URL(db.URL))
	require.NoError(t, err)
	defer old.Close(context.Background())
	p.FreezeOpen()
	fresh, err := pgx.Connect(ctx, p.URL(db.URL))
	require.NoError(t, err, "a new connection works")
	defer fresh.Close(context.Background())
	var one int
	require.NoError(t, fresh.QueryRow(ctx, `SELECT 1`).Scan(&one))

	done := make(chan error, 1)
	go func() { done <- old.QueryRow(ctx, `SELECT 1`).Scan(&one) }()
	select {
	case err := <-done:
		t.Fatalf("the frozen connection answered: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	p.Thaw()
	require.NoError(t, <-done, "thawed, the frozen connection goes on")
}
