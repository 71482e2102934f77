package pgtest_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
)

func TestPgBouncerTransactionMode(t *testing.T) {
	t.Parallel()
	db := pgtest.Setup(t)
	pb := pgtest.NewPgBouncer(t, db.URL)
	conn, err := pgx.Connect(t.Context(), pb.URL(db.URL)+"&default_query_exec_mode=exec")
	require.NoError(t, err)
	defer conn.Close(t.Context())

	var name string
	require.NoError(t, conn.QueryRow(t.Context(), "SELECT current_database()").Scan(&name))
	require.Equal(t, db.Name, name, "the database of the same name behind PgBouncer")

	// Transaction mode: a server connection is the client's for one
	// transaction only; the pid announced at connect is PgBouncer's own.
	var pid uint32
	require.NoError(t, conn.QueryRow(t.Context(), "SELECT pg_backend_pid()").Scan(&pid))
	require.NotEqual(t, conn.PgConn().PID(), pid, "the backend key data comes from PgBouncer, not from the server")
}
