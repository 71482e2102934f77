package cli

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestConnStringReadsOnlyLibpqVariables: PGFENCE_TOKEN, which pgfence run
// exports to its command, is not a libpq variable; a pgfence called inside
// run must not take it for a configured connection (and then connect to
// whatever libpq's defaults name instead of the documented default URL).
func TestConnStringReadsOnlyLibpqVariables(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	for _, name := range libpqEnv {
		t.Setenv(name, "")
	}
	g := &globals{}
	t.Setenv("PGFENCE_TOKEN", "8796093022209")
	t.Setenv("PGFENCE_RESOURCE", "job")
	require.Equal(t, DefaultDatabaseURL, g.connString())

	t.Setenv("PGSERVICE", "billing")
	require.Empty(t, g.connString(), "a libpq variable: pgx reads the environment itself")

	t.Setenv("DATABASE_URL", "postgres://db.example/app")
	require.Equal(t, "postgres://db.example/app", g.connString())
	g.databaseURL = "postgres://flag.example/app"
	require.Equal(t, "postgres://flag.example/app", g.connString())
}
