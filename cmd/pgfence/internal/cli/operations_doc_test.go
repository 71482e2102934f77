package cli_test

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/cli"
)

// TestOperationsDocQueriesAndMetrics: every SQL block of docs/operations.md
// runs as a role granted usage and nothing more (placeholders filled in),
// and every metric it names is one that status --format prometheus prints
// (but for the example of an OpenTelemetry name as a Prometheus exporter
// writes it).
func TestOperationsDocQueriesAndMetrics(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../../../docs/operations.md")
	require.NoError(t, err)
	doc := string(b)
	s := newStatusStory(t)

	blocks := regexp.MustCompile("(?s)```sql\n(.*?)```").FindAllStringSubmatch(doc, -1)
	require.GreaterOrEqual(t, len(blocks), 5)
	conn, err := pgx.Connect(t.Context(), s.db.URLAs(s.reader))
	require.NoError(t, err)
	defer conn.Close(t.Context())
	for _, m := range blocks {
		sql := strings.ReplaceAll(m[1], "'<election>'", "'live'")
		rows, err := conn.Query(t.Context(), sql)
		require.NoError(t, err, sql)
		rows.Close()
		require.NoError(t, rows.Err(), sql)
	}

	code, out, errOut := run(t, "status", "--format", "prometheus", "--database-url", s.db.URLAs(s.reader))
	require.Equal(t, cli.ExitOK, code, errOut)
	printed := parseExposition(t, out)
	named := regexp.MustCompile(`\bpgfence_[a-z_]+\b`).FindAllString(doc, -1)
	require.NotEmpty(t, named)
	for _, name := range named {
		if name == "pgfence_lease_losses_total" {
			continue // an OpenTelemetry counter as exported to Prometheus
		}
		require.Contains(t, printed, name, "docs/operations.md names a metric that status does not print")
	}
	for _, instrument := range []string{"pgfence.lease.acquire.duration", "pgfence.lease.renewals", "pgfence.lease.renew.duration",
		"pgfence.lease.renew.headroom", "pgfence.lease.losses", "pgfence.lease.active", "pgfence.election.leader", "pgfence.write.refusals"} {
		require.Contains(t, doc, "| `"+instrument+"` |", "the instruments table lists %s", instrument)
	}
}
