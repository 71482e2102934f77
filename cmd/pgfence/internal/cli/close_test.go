package cli

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// TestClosePoolDoesNotWaitForALeakedConnection: pgxpool.Close waits forever
// for a connection that was never released (golang-migrate's, after its
// WithInstance failed); closePool returns anyway. Not parallel: it shortens
// the package's bound while it runs.
func TestClosePoolDoesNotWaitForALeakedConnection(t *testing.T) {
	defer func(d time.Duration) { closeWait = d }(closeWait)
	closeWait = 50 * time.Millisecond
	db := pgtest.Setup(t)
	pool, err := pgxpool.New(t.Context(), db.URL)
	require.NoError(t, err)
	leaked, err := pool.Acquire(t.Context())
	require.NoError(t, err)
	closePool(pool) // returns: the test would time out otherwise
	leaked.Release()
}
