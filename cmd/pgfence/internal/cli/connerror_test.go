package cli_test

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/cli"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// preferTLS drops sslmode from u, so that pgx uses the default (prefer) as
// a user's URL does: it tries TLS first, then without, and reports both
// attempts.
func preferTLS(t *testing.T, u string) string {
	t.Helper()
	p, err := url.Parse(u)
	require.NoError(t, err)
	q := p.Query()
	q.Del("sslmode")
	p.RawQuery = q.Encode()
	return p.String()
}

// TestConnectionErrorsSayOneCause: pgx reports every attempt of a
// connection (with and without TLS under sslmode=prefer), so one cause used
// to appear twice, or behind "server refused TLS connection", with the fix
// "start PostgreSQL" for a server that runs. Each cause is said once, with
// the fix that matches it, by the commands and by doctor.
func TestConnectionErrorsSayOneCause(t *testing.T) {
	t.Parallel()
	db := pgtest.Empty(t)

	// A private cluster that asks role pw for a password (scram), and has
	// no TLS, as the one the issue met.
	cluster := pgtest.NewCluster(t, pgtest.ClusterOptions{NoMigrate: true})
	admin := cluster.AdminURL()
	hba := filepath.Join(cluster.DataDir(), "pg_hba.conf")
	old, err := os.ReadFile(hba)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(hba, append([]byte("host all pw 127.0.0.1/32 scram-sha-256\n"), old...), 0o600))
	conn, err := pgx.Connect(t.Context(), admin)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(t.Context(), `CREATE ROLE pw LOGIN PASSWORD 'right'; SELECT pg_reload_conf()`)
	require.NoError(t, err)
	wrongPassword := strings.Replace(preferTLS(t, pgtest.URLAs(admin, "pw")), "pw@", "pw:wrong@", 1)

	for _, c := range []struct {
		name, url, once, fix string
	}{
		{"nothing listens", "postgres://postgres@127.0.0.1:1/postgres?connect_timeout=5", "connection refused", "start it"},
		{"no such role", preferTLS(t, db.URLAs("no_such_role")), `role "no_such_role" does not exist`, "check the user name"},
		{"no such database", preferTLS(t, pgtest.URLFor(db.URL, "no_such_db")), `database "no_such_db" does not exist`, "check the database name"},
		{"wrong password", wrongPassword, `password authentication failed for user "pw"`, "check the user and password"},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, _, errOut := run(t, "status", "--database-url", c.url)
			require.Equal(t, cli.ExitError, code, errOut)
			require.Equal(t, 1, strings.Count(errOut, c.once), "the cause once: %q", errOut)
			require.Contains(t, errOut, c.fix)
			require.NotContains(t, errOut, "TLS", "a refused TLS attempt under sslmode=prefer is no cause")
			if c.fix != "start it" {
				require.NotContains(t, errOut, "start", "the server runs")
			}
			require.Equal(t, 1, strings.Count(errOut, "\n"), "one line: %q", errOut)

			_, fs, out := doctorFindings(t, c.url)
			require.Equal(t, "fail", fs["connection"].Status, out)
			require.Equal(t, 1, strings.Count(fs["connection"].Detail, c.once), out)
			require.Contains(t, fs["connection"].Fix, c.fix, out)
		})
	}
}
