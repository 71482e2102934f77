//go:build linux

package cli_test

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// TestMigrateDownAsksOnATerminal: on a terminal, migrate down asks y/N; "n"
// (or just Enter) changes nothing, "y" goes ahead. Run under script(1),
// which gives pgfence a pseudo-terminal.
func TestMigrateDownAsksOnATerminal(t *testing.T) {
	t.Parallel()
	scriptBin, err := exec.LookPath("script")
	if err != nil {
		t.Skip("script(1) (util-linux) is not installed")
	}
	db := pgtest.Setup(t)
	bin := buildPgfence(t)
	down := func(answer string) string {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, scriptBin, "-qec", bin+" migrate down 1 --database-url "+db.URL, "/dev/null")
		cmd.Stdin = strings.NewReader(answer)
		out, _ := cmd.CombinedOutput()
		return string(out)
	}

	out := down("n\n")
	require.Contains(t, out, fmt.Sprintf("migrate schema fence down from version %d to %d? [y/N]", migrations.Latest, migrations.Latest-1))
	require.Contains(t, out, "not confirmed")
	v, err := sqlfuncs.Version(t.Context(), db.Pool)
	require.NoError(t, err)
	require.Equal(t, migrations.Latest, v)

	out = down("y\n")
	require.Contains(t, out, fmt.Sprintf("version %d, clean", migrations.Latest-1), out)
	v, err = sqlfuncs.Version(t.Context(), db.Pool)
	require.NoError(t, err)
	require.Equal(t, migrations.Latest-1, v)
}
