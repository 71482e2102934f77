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

// readmeSection returns the README's section that starts with heading (up
// to the next heading of the same level).
func readmeSection(t *testing.T, heading string) string {
	t.Helper()
	readme, err := os.ReadFile("../../../../README.md")
	require.NoError(t, err)
	s := string(readme)
	i := strings.Index(s, "\n"+heading+"\n")
	require.GreaterOrEqual(t, i, 0, "README has no %q", heading)
	s = s[i+1:]
	level := heading[:strings.Index(heading, " ")+1]
	if j := strings.Index(s[len(heading):], "\n"+level); j >= 0 {
		s = s[:len(heading)+j+1]
	}
	return s
}

// runQuickstart runs the shell blocks of the README's Quickstart from step
// 3 on (steps 1 and 2 build the binary and start a server, which the test
// does its own way) against a fresh database, and returns the database and
// the output.
func runQuickstart(t *testing.T) (*pgtest.DB, string) {
	t.Helper()
	if _, err := exec.LookPath("psql"); err != nil {
		if os.Getenv(pgtest.EnvRequireDB) == "1" {
			t.Fatal("the README's quickstart needs psql: ", err)
		}
		t.Skip("psql is not installed")
	}
	quick := readmeSection(t, "## Quickstart")
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
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", script.String())
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "DATABASE_URL="+db.URL, "PATH="+filepath.Dir(bin)+":"+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "script:\n%s\noutput:\n%s", script.String(), out)
	return db, string(out)
}

// TestREADMEQuickstartWorks: the table the Quickstart creates is the one it
// protects, and the script that pgfence run starts writes under the token
// of that same resource.
func TestREADMEQuickstartWorks(t *testing.T) {
	t.Parallel()
	db, out := runQuickstart(t)
	var note string
	var written, latest int64
	require.NoError(t, db.Pool.QueryRow(t.Context(), `SELECT o.note, o.fence_token, l.token FROM orders o, fence.leases l WHERE o.id = 1 AND l.resource = 'orders'`).
		Scan(&note, &written, &latest))
	require.Equal(t, "exported", note)
	require.Equal(t, latest, written, "written under the lease that pgfence run took")
	require.Regexp(t, `orders\s+\S+\s+\d+\s+ttl\s+released`, out, "status shows the released lease")
}

// TestREADMESQLRunsAfterTheQuickstart: the statements of "Using it from
// SQL", pasted into psql after the Quickstart, run as they are, on the
// Quickstart's table (they used to insert into a column "total" that the
// Quickstart's orders does not have).
func TestREADMESQLRunsAfterTheQuickstart(t *testing.T) {
	t.Parallel()
	db, _ := runQuickstart(t)
	section := readmeSection(t, "## Using it from SQL")
	blocks := regexp.MustCompile("(?s)```sql\n(.*?)```").FindAllStringSubmatch(section, -1)
	require.NotEmpty(t, blocks)
	sql := blocks[0][1] // the next blocks belong to "A lease per row", another table

	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "psql", db.URL, "-X", "-v", "ON_ERROR_STOP=1", "-f", "-")
	cmd.Stdin = strings.NewReader(sql)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "sql:\n%s\noutput:\n%s", sql, out)

	var note string
	var written, latest int64
	var live bool
	require.NoError(t, db.Pool.QueryRow(t.Context(), `SELECT o.note, o.fence_token, l.token, l.live FROM orders o, fence.leases l WHERE o.id = 2 AND l.resource = 'orders'`).
		Scan(&note, &written, &latest, &live))
	require.Equal(t, "paid", note)
	require.Equal(t, latest, written, "written under the token fence.acquire returned")
	require.False(t, live, "released at the end")
	var lines int
	require.NoError(t, db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM order_lines`).Scan(&lines))
	require.Zero(t, lines)
}
