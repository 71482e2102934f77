package cli_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLibraryModuleRequiresOnlyTheLibrarysDependencies: the root go.mod (the
// library: gofence, sqlfuncs, migrations, and the harness its tests use)
// requires pgx and golang-migrate, and testify for its tests, which pgx
// and golang-migrate require too; whatever else it required, every program
// that requires pgfence would carry (the CLI's cobra, a harness's
// testcontainers). Its indirect requirements are the versions the graph of
// those three gives (go mod tidy from a go.mod that lists only them).
func TestLibraryModuleRequiresOnlyTheLibrarysDependencies(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command")
	}
	out, err := exec.Command("go", "mod", "edit", "-json", "../../../../go.mod").Output()
	require.NoError(t, err)
	var mod struct {
		Require []struct {
			Path     string
			Indirect bool
		}
	}
	require.NoError(t, json.Unmarshal(out, &mod))
	var direct []string
	for _, r := range mod.Require {
		if !r.Indirect {
			direct = append(direct, r.Path)
		}
	}
	require.ElementsMatch(t, []string{"github.com/golang-migrate/migrate/v4", "github.com/jackc/pgx/v5", "github.com/stretchr/testify"}, direct,
		"the library's go.mod: a requirement of the CLI or of a test tool belongs in cmd/pgfence/go.mod or integration/go.mod")
}

// TestTestCommandCoversEveryModule: in workspace mode ./... stops at a
// directory with a go.mod of its own, so the test command names every
// module of go.work; the README, docs/development.md and the pg15 leg of
// .ci/run give the same command.
func TestTestCommandCoversEveryModule(t *testing.T) {
	t.Parallel()
	work, err := os.ReadFile("../../../../go.work")
	require.NoError(t, err)
	use := regexp.MustCompile(`(?s)\buse \((.*?)\)`).FindStringSubmatch(string(work))
	require.NotNil(t, use, "go.work has a use block")
	var patterns []string
	for _, line := range strings.Split(use[1], "\n") {
		dir := strings.TrimSpace(line)
		switch {
		case dir == "" || strings.HasPrefix(dir, "//"):
		case dir == ".":
			patterns = append(patterns, "./...")
		default:
			patterns = append(patterns, strings.TrimSuffix(dir, "/")+"/...")
		}
	}
	require.Contains(t, patterns, "./cmd/pgfence/...")
	require.Contains(t, patterns, "./integration/...")

	command := "go test -count=1 -timeout 30m " + strings.Join(patterns, " ")
	for _, doc := range []string{"README.md", "docs/development.md"} {
		raw, err := os.ReadFile("../../../../" + doc)
		require.NoError(t, err)
		require.Contains(t, string(raw), "\n"+command+"\n", "%s gives the test command of every module of go.work", doc)
	}
	ci, err := os.ReadFile("../../../../.ci/run")
	require.NoError(t, err)
	leg := regexp.MustCompile(`(?m)^leg pg15 "" "" "" (.*)$`).FindStringSubmatch(string(ci))
	require.NotNil(t, leg, ".ci/run has its pg15 leg")
	require.True(t, slices.Equal(patterns, strings.Fields(leg[1])), ".ci/run's pg15 leg runs %q, go.work has %q", leg[1], patterns)
}
