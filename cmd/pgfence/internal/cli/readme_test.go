//go:build linux

package cli_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// TestREADMEQuickstartWorks runs the shell blocks of the README's Quickstart
// from step 3 on (steps 1 and 2 build the binary and start a server, which
// the test does its own way) against a fresh database: the table it creates
// is the one it protects, and the script that pgfence run starts writes
// under the token of that same resource.
func TestREADMEQuickstartWorks(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("psql"); err != nil {
		if os.Getenv(pgtest.EnvRequireDB) == "1" {
			t.Fatal("the README's quickstart needs psql: ", err)
		}
		t.Skip("psql is not installed")
	}
	readme, err := os.ReadFile("../../../../README.md")
	require.NoError(t, err)
	quick := string(readme)
	quick = quick[strings.Index(quick, "## Quickstart"):]
	quick = quick[:strings.Index(quick[3:], "\n## ")+3]
	quick = quick[strings.Index(quick, "3. **"):]
	var script strings.Builder
	script.WriteString("set -e\n")
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(quick, -1) {
		for _, line := range strings.Split(m[1], "\n") {
			// The blocks are indented under their list item; a reader's
			// copy has no such indentation.
			script.WriteString(strings.TrimPrefix(line, "   ") + "\n")
		}
	}
	require.Contains(t, script.String(), "pgfence run orders -- ./export.sh")

	db := pgtest.Empty(t)
	bin := buildPgfence(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", script.String())
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "DATABASE_URL="+db.URL, "PATH="+filepath.Dir(bin)+":"+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "script:\n%s\noutput:\n%s", script.String(), out)

	var note string
	var written, latest int64
	require.NoError(t, db.Pool.QueryRow(t.Context(), `SELECT o.note, o.fence_token, l.token FROM orders o, fence.leases l WHERE o.id = 1 AND l.resource = 'orders'`).
		Scan(&note, &written, &latest))
	require.Equal(t, "exported", note)
	require.Equal(t, latest, written, "written under the lease that pgfence run took")
	require.Regexp(t, `orders\s+\S+\s+\d+\s+ttl\s+released`, string(out), "status shows the released lease")
}
