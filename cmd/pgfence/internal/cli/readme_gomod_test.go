package cli_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestREADMEGoModLinesBuildAProgram (issue 28 item 5): the README's
// "Using it from Go" gives the go.mod lines a program needs while pgfence
// is unpublished. A module of its own, outside the workspace, with exactly
// those lines (the clone's path put in), importing gofence and otelfence,
// tidies and builds.
func TestREADMEGoModLinesBuildAProgram(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: go mod tidy and a build of a module of its own")
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command")
	}
	root, err := filepath.Abs("../../../..")
	require.NoError(t, err)
	sec := readmeSection(t, "## Using it from Go")
	m := regexp.MustCompile("(?s)```go.mod\n(.*?)```").FindStringSubmatch(sec)
	require.NotNil(t, m, "the README's \"Using it from Go\" has a go.mod block")
	lines := strings.ReplaceAll(m[1], "/path/to/pgfence", root)

	dir := t.TempDir()
	write := func(name, content string) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644))
	}
	write("go.mod", "module example.com/app\n\ngo 1.26.0\n\n"+lines)
	write("main.go", `package main

import (
	"context"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/otelfence"
)

func main() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "")
	if err != nil {
		log.Fatal(err)
	}
	obs, err := otelfence.New()
	if err != nil {
		log.Fatal(err)
	}
	if err := gofence.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	client, err := gofence.New(pool, &gofence.Config{Observer: obs})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx)
}
`)
	env := []string{"GOWORK=off", "GOFLAGS="}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GOWORK=") && !strings.HasPrefix(kv, "GOFLAGS=") {
			env = append(env, kv)
		}
	}
	for _, args := range [][]string{{"mod", "tidy"}, {"build", "-o", os.DevNull, "."}} {
		cmd := exec.CommandContext(t.Context(), "go", args...)
		cmd.Dir, cmd.Env = dir, env
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "go %s: %s", strings.Join(args, " "), out)
	}
}
