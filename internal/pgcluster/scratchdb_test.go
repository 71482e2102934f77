package pgcluster_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgcluster"
	"github.com/pgfence/pgfence/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// dbExists reports whether database name exists on the server of admin.
func dbExists(t *testing.T, admin *pgx.Conn, name string) bool {
	t.Helper()
	var n int
	if err := admin.QueryRow(t.Context(), "SELECT count(*) FROM pg_database WHERE datname = $1", name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// A scratch database gets a fresh random name with the prefix, and its drop
// function removes it even when its ctx is already cancelled and a session
// is still connected to it (an interrupted demo or bench).
func TestCreateScratchDBDropsOnCancelledContext(t *testing.T) {
	adminURL := pgtest.AdminURL(t)
	admin, err := pgx.Connect(t.Context(), adminURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())

	name, drop, err := pgcluster.CreateScratchDB(t.Context(), admin, "pgcluster_test_")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(name, "pgcluster_test_") || len(name) != len("pgcluster_test_")+8 {
		t.Fatalf("name %q: want pgcluster_test_ and 8 hex digits", name)
	}
	if !dbExists(t, admin, name) {
		t.Fatalf("database %s was not created", name)
	}
	other, _, err := pgcluster.CreateScratchDB(t.Context(), admin, "pgcluster_test_")
	if err != nil {
		t.Fatal(err)
	}
	defer pgcluster.DropDB(context.Background(), admin, other) //nolint:errcheck // best effort
	if other == name {
		t.Fatalf("two scratch databases named %s", name)
	}

	// A session left connected to the scratch database.
	conn, err := pgx.Connect(t.Context(), pgtest.URLFor(adminURL, name))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())

	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	if err := drop(cancelled); err != nil {
		t.Fatalf("drop with a cancelled ctx: %v", err)
	}
	if dbExists(t, admin, name) {
		t.Fatalf("database %s survived its drop", name)
	}
	// Dropping again is not an error (IF EXISTS).
	if err := drop(t.Context()); err != nil {
		t.Fatalf("second drop: %v", err)
	}
}

// CreateDB clones the template it is given, and returns CREATE DATABASE's
// error (here: the name is taken) without a drop function.
func TestCreateDBFromTemplate(t *testing.T) {
	db := pgtest.Setup(t) // migrated: fence.version() exists
	admin, err := pgx.Connect(t.Context(), pgtest.AdminURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	db.Pool.Close() // CREATE DATABASE ... TEMPLATE needs the template free of sessions

	name := pgcluster.ScratchName("pgcluster_test_", 4)
	drop, err := pgcluster.CreateDB(t.Context(), admin, name, db.Name)
	if err != nil {
		t.Fatal(err)
	}
	defer drop(context.Background()) //nolint:errcheck // checked below
	conn, err := pgx.Connect(t.Context(), pgtest.URLFor(pgtest.AdminURL(t), name))
	if err != nil {
		t.Fatal(err)
	}
	var v int
	err = conn.QueryRow(t.Context(), "SELECT fence.version()").Scan(&v)
	conn.Close(context.Background())
	if err != nil || v == 0 {
		t.Fatalf("clone of the migrated database: fence.version() = %d, %v", v, err)
	}

	again, err := pgcluster.CreateDB(t.Context(), admin, name, "")
	if err == nil || again != nil {
		t.Fatalf("CreateDB of a taken name: drop %v, err %v; want an error and no drop", again != nil, err)
	}
	if err := drop(t.Context()); err != nil {
		t.Fatal(err)
	}
	if dbExists(t, admin, name) {
		t.Fatalf("database %s survived its drop", name)
	}
}

// WaitReady returns once check is satisfied, and when ctx ends first it
// returns the check's last error, naming the URL without its password.
func TestWaitReady(t *testing.T) {
	adminURL := pgtest.AdminURL(t)
	calls := 0
	err := pgcluster.WaitReady(t.Context(), adminURL, func(ctx context.Context, conn *pgx.Conn) (bool, error) {
		calls++
		var one int
		err := conn.QueryRow(ctx, "SELECT 1").Scan(&one)
		return calls >= 3 && one == 1, err
	})
	if err != nil || calls != 3 {
		t.Fatalf("WaitReady: %v after %d checks; want nil after 3", err, calls)
	}

	// The check itself ends ctx, so that ctx ends after a check ran however
	// slow the connection is (a 500 ms timeout ran out before the first
	// connection on a machine running two copies of the suite).
	never := errors.New("not yet")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	withPassword := strings.Replace(adminURL, "postgres@", "postgres:sekrit@", 1)
	err = pgcluster.WaitReady(ctx, withPassword, func(context.Context, *pgx.Conn) (bool, error) { cancel(); return false, never })
	if !errors.Is(err, never) {
		t.Fatalf("WaitReady past its ctx: %v; want the check's error", err)
	}
	if strings.Contains(err.Error(), "sekrit") {
		t.Fatalf("WaitReady's error shows the password: %v", err)
	}
}
