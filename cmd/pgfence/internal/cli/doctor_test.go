package cli_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// TestDoctorFixNamesTheDatabase: the fix of the idle-in-transaction check is
// a statement to run as it is, on the database doctor looked at (it said
// "ALTER DATABASE ... SET").
func TestDoctorFixNamesTheDatabase(t *testing.T) {
	t.Parallel()
	db := pgtest.Setup(t)
	_, fs, out := doctorFindings(t, db.URL)
	f := fs["idle_in_transaction_session_timeout"]
	require.Equal(t, "warn", f.Status, "PostgreSQL's default is 0: %s", out)
	require.Contains(t, f.Fix, "ALTER DATABASE "+db.Name+" SET idle_in_transaction_session_timeout = '1min'")
	require.NotContains(t, f.Fix, "...")
}
