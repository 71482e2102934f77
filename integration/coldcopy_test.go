package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// TestColdCopyRestoreTakesTheDocumentedStep: a file-system level backup,
// PostgreSQL's own "copy the data directory of a cleanly stopped server"
// (docs: File System Level Backup), restored in place of the original after
// the original granted more. Nothing the kit can read tells the restored
// server from the original restarted: same system identifier, timeline,
// database and table OIDs, fence.origin at home, and the unlogged
// fence.epoch_cache kept its row (a clean shutdown does not empty it). So
// docs/operations.md and docs/design.md ("Copies of a database") ask for one
// step before the first grant: DELETE FROM fence.origin as the kit's owner,
// which makes the next grant treat the data as a restored copy and start a
// new epoch. With it, the copy hands out none of the tokens the original
// granted after the copy, and the original's last holder is stale there.
// (Found by the red team of 007, which restored without the step and got
// the original's tokens again.)
func TestColdCopyRestoreTakesTheDocumentedStep(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	const res = "cold/r"
	conn := connect(t, ctx, c.URL(), false)
	before := newLedger()
	tok := mustAcquire(t, ctx, conn, res, "before-copy")
	before.add(res, tok)
	mustRelease(t, ctx, conn, res, tok)
	require.NoError(t, conn.Close(ctx))

	// The cold copy: the server stopped cleanly, its data directory copied
	// (cp -a keeps owners and modes).
	c.Stop(t, "fast")
	data := c.DataDir()
	backup := filepath.Join(filepath.Dir(data), "cold-copy")
	out, err := exec.CommandContext(ctx, "cp", "-a", data, backup).CombinedOutput()
	require.NoError(t, err, "cp -a: %s", out)
	c.Start(t)

	// The original goes on granting; these grants are not in the copy.
	conn = connect(t, ctx, c.URL(), false)
	afterCopy := newLedger()
	for range 3 {
		tok := mustAcquire(t, ctx, conn, res, "original")
		afterCopy.add(res, tok)
		mustRelease(t, ctx, conn, res, tok)
	}
	held := mustAcquire(t, ctx, conn, res, "original-holder")
	afterCopy.add(res, held)
	require.NoError(t, conn.Close(ctx))

	// The original is lost; the copy is restored in its place.
	c.Stop(t, "fast")
	require.NoError(t, os.RemoveAll(data))
	require.NoError(t, os.Rename(backup, data))
	c.Start(t)

	conn = connect(t, ctx, c.URL(), false)
	// The documented step (the cluster's superuser owns the kit here).
	_, err = conn.Exec(ctx, `DELETE FROM fence.origin`)
	require.NoError(t, err)
	all := before.clone()
	all.addAll(afterCopy)
	dup := 0
	for i := range 4 {
		tok, err := sqlfuncs.Revoke(ctx, conn, res)
		require.NoError(t, err)
		for _, old := range all.all(res) {
			if tok == old {
				dup++
				t.Errorf("grant %d on the restored copy handed out token %d (epoch %d, counter %d), which the original had already granted for %s after the copy",
					i, tok, epochOf(tok), counterOf(tok), res)
			}
		}
		if tok == held {
			// The original's last holder still has this token: it is the
			// latest grant of the resource now, so its writes pass.
			if err := sqlfuncs.Check(ctx, conn, res, held); err == nil {
				t.Errorf("the original's holder of %d passes fence.check on the restored copy, and so does the copy's own holder of the same token", held)
			}
		}
	}
	if dup == 0 {
		tok := mustAcquire(t, ctx, conn, res, "copy")
		requireAbove(t, all, res, tok, "after restoring a cold copy")
		require.Greater(t, epochOf(tok), epochOf(held), "a new epoch")
	}
	require.Error(t, sqlfuncs.Check(ctx, conn, res, held), "the original's last holder is stale on the copy")
}
