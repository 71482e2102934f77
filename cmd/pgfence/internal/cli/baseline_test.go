package cli_test

import (
	"encoding/json"
	"fmt"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/cli"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// applyWithPsql applies the up files of versions 1 to upTo with the
// README's "Copying the files" loop (psql, one transaction per file, no
// golang-migrate), run by sh on a folder holding copies of those files.
func applyWithPsql(t *testing.T, db *pgtest.DB, upTo int) {
	t.Helper()
	if _, err := exec.LookPath("psql"); err != nil {
		if os.Getenv(pgtest.EnvRequireDB) == "1" {
			t.Fatal("applying the files needs psql: ", err)
		}
		t.Skip("psql is not installed")
	}
	sec := readmeSection(t, "## Installing the kit into your database")
	sec = sec[strings.Index(sec, "**Copying the files**"):]
	m := regexp.MustCompile("(?s)```sh\n(.*?)```").FindStringSubmatch(sec)
	require.NotNil(t, m, "the README's \"Copying the files\" has a sh block")
	require.Contains(t, m[1], "migrations/0*.up.sql")

	files, err := filepath.Glob("../../../../migrations/0*.up.sql")
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(files), upTo)
	dir := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(dir, "migrations"), 0o755))
	for _, f := range files[:upTo] {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "migrations", filepath.Base(f)), b, 0o644))
	}
	cmd := exec.CommandContext(t.Context(), "sh", "-ec", m[1])
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "DATABASE_URL="+db.URL)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	v, err := sqlfuncs.Version(t.Context(), db.Pool)
	require.NoError(t, err)
	require.Equal(t, upTo, v, "the README's loop applied every file: %s", out)
}

func versionTableExists(t *testing.T, db *pgtest.DB) bool {
	t.Helper()
	var exists bool
	require.NoError(t, db.Pool.QueryRow(t.Context(), `SELECT to_regclass('public.fence_schema_migrations') IS NOT NULL`).Scan(&exists))
	return exists
}

// TestMigrateAdoptsAKitAppliedWithPsql (issue 28 item 4): a kit applied
// file by file has fence.version() and no version table. migrate up took
// the database for an empty one and left version 1 dirty; down, goto and
// force created an empty version table. Now version and doctor say what
// happened and name the command, every changing action refuses and
// creates nothing, and migrate baseline records the version, after which
// up goes on from there.
func TestMigrateAdoptsAKitAppliedWithPsql(t *testing.T) {
	t.Parallel()
	db := pgtest.Empty(t)
	url := "--database-url=" + db.URL
	copied := migrations.Latest - 1
	applyWithPsql(t, db, copied)
	fix := fmt.Sprintf("pgfence migrate baseline to record version %d", copied)

	code, out, errOut := run(t, "migrate", "version", url)
	require.Equal(t, cli.ExitOK, code, errOut)
	require.Contains(t, out, fmt.Sprintf("version %d, not recorded", copied))
	require.Contains(t, out, fmt.Sprintf("pgfence migrate baseline records version %d", copied))
	code, out, errOut = run(t, "migrate", "version", "--json", url)
	require.Equal(t, cli.ExitOK, code, errOut)
	var got map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	require.Equal(t, map[string]any{"version": float64(copied), "dirty": nil, "recorded": false}, got)

	code, fs, out := doctorFindings(t, db.URL)
	require.Equal(t, cli.ExitError, code, out)
	require.Equal(t, "fail", fs["migrations"].Status)
	require.Contains(t, fs["migrations"].Detail, "installed without golang-migrate")
	require.Contains(t, fs["migrations"].Fix, fmt.Sprintf("pgfence migrate baseline (records version %d)", copied))
	require.NotContains(t, out, "cannot read")

	for _, args := range [][]string{{"up"}, {"down", "1", "--yes"}, {"down", "--yes"}, {"goto", "1", "--yes"}, {"force", fmt.Sprint(copied)}} {
		code, _, errOut := run(t, append(append([]string{"migrate"}, args...), url)...)
		require.Equal(t, cli.ExitError, code, "%v: %s", args, errOut)
		require.Contains(t, errOut, fix, args)
		require.Contains(t, errOut, "nothing was changed", args)
		require.False(t, versionTableExists(t, db), "migrate %v created the version table", args)
		v, err := sqlfuncs.Version(t.Context(), db.Pool)
		require.NoError(t, err)
		require.Equal(t, copied, v, args)
	}

	for range 2 { // the second finds the same record and changes nothing
		code, out, errOut = run(t, "migrate", "baseline", url)
		require.Equal(t, cli.ExitOK, code, errOut)
		require.Equal(t, fmt.Sprintf("version %d, clean\n", copied), out)
	}
	code, out, errOut = run(t, "migrate", "up", url)
	require.Equal(t, cli.ExitOK, code, errOut)
	require.Equal(t, fmt.Sprintf("version %d, clean\n", migrations.Latest), out)
	_, fs, out = doctorFindings(t, db.URL)
	require.Equal(t, "ok", fs["migrations"].Status, out)
}

// TestMigrateBaselineRefusesWithoutAKit: nothing to record, nothing created.
func TestMigrateBaselineRefusesWithoutAKit(t *testing.T) {
	t.Parallel()
	db := pgtest.Empty(t)
	code, _, errOut := run(t, "migrate", "baseline", "--database-url", db.URL)
	require.Equal(t, cli.ExitError, code, errOut)
	require.Contains(t, errOut, "pgfence migrate up installs it")
	nothingInstalled(t, db)
}

// upstreamMigrate finds the upstream golang-migrate CLI (built with the
// pgx5 driver): $PGFENCE_MIGRATE_CLI, else `migrate` on PATH; it skips, or
// fails under PGFENCE_TEST_REQUIRE_MIGRATE_CLI=1.
func upstreamMigrate(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("PGFENCE_MIGRATE_CLI"); p != "" {
		return p
	}
	if p, err := exec.LookPath("migrate"); err == nil {
		return p
	}
	msg := "the upstream migrate CLI is not installed: go install -tags pgx5 github.com/golang-migrate/migrate/v4/cmd/migrate@v4.20.1"
	if os.Getenv("PGFENCE_TEST_REQUIRE_MIGRATE_CLI") == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// TestUpstreamMigrateOnACopiedKitIsRepairedWithTheNamedForce: run before
// the baseline, the upstream migrate CLI takes a copied kit for an empty
// database, fails on 001 and records version 1 dirty. doctor and migrate
// then name the exact repair (force to the version fence.version()
// reports, since the failed file rolled back), after which up goes on.
func TestUpstreamMigrateOnACopiedKitIsRepairedWithTheNamedForce(t *testing.T) {
	t.Parallel()
	cli_ := upstreamMigrate(t)
	db := pgtest.Empty(t)
	url := "--database-url=" + db.URL
	copied := migrations.Latest - 1
	applyWithPsql(t, db, copied)

	u, err := neturl.Parse(db.URL)
	require.NoError(t, err)
	u.Scheme = "pgx5"
	q := u.Query()
	q.Set("sslmode", "disable")
	q.Set("x-migrations-table", migrations.Table)
	u.RawQuery = q.Encode()
	dir, err := filepath.Abs("../../../../migrations")
	require.NoError(t, err)
	out, err := exec.CommandContext(t.Context(), cli_, "-path", dir, "-database", u.String(), "up").CombinedOutput()
	require.Error(t, err, "upstream migrate up on a copied kit: %s", out)
	require.Contains(t, string(out), "already exists")

	force := fmt.Sprintf("pgfence migrate force %d (fence.version() says the schema is at %d)", copied, copied)
	code, fs, doc := doctorFindings(t, db.URL)
	require.Equal(t, cli.ExitError, code, doc)
	require.Equal(t, "fail", fs["migrations"].Status)
	require.Contains(t, fs["migrations"].Fix, force)
	code, _, errOut := run(t, "migrate", "up", url)
	require.Equal(t, cli.ExitError, code)
	require.Contains(t, errOut, force)

	code, outS, errOut := run(t, "migrate", "force", fmt.Sprint(copied), url)
	require.Equal(t, cli.ExitOK, code, errOut)
	require.Equal(t, fmt.Sprintf("version %d, clean\n", copied), outS)
	code, outS, errOut = run(t, "migrate", "up", url)
	require.Equal(t, cli.ExitOK, code, errOut)
	require.Equal(t, fmt.Sprintf("version %d, clean\n", migrations.Latest), outS)
}
