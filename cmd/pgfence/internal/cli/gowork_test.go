package cli_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestGoWorkSumIsComplete (issue 28 item 6): go.work.sum holds the
// checksums the workspace needs beyond the modules' own go.sum files. When
// it misses some, the first `go doc` or `go list -m all` in a fresh clone
// adds them (181 lines once), and every later build says +dirty. This
// copies the tracked files into a directory of their own, runs those
// commands there, and fails when go.work.sum changed. The fix: run `go list
// -m all` and `go doc ./gofence Client` at the root (never `go work sync`,
// which raises the library's requirements), and commit go.work.sum.
func TestGoWorkSumIsComplete(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command")
	}
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git command")
	}
	root, err := filepath.Abs("../../../..")
	require.NoError(t, err)
	files, err := exec.Command("git", "-C", root, "ls-files", "-z").Output()
	if err != nil {
		t.Skipf("not a git checkout (%v): nothing to compare", err)
	}
	dir := t.TempDir()
	for _, name := range strings.Split(strings.TrimSuffix(string(files), "\x00"), "\x00") {
		data, err := os.ReadFile(filepath.Join(root, name))
		if os.IsNotExist(err) {
			continue // deleted in the working tree
		}
		require.NoError(t, err)
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), data, 0o644))
	}
	before, err := os.ReadFile(filepath.Join(dir, "go.work.sum"))
	require.NoError(t, err)

	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GOWORK=") && !strings.HasPrefix(kv, "GOFLAGS=") {
			env = append(env, kv)
		}
	}
	for _, args := range [][]string{{"list", "-m", "all"}, {"doc", "./gofence", "Client"}} {
		cmd := exec.CommandContext(t.Context(), "go", args...)
		cmd.Dir, cmd.Env = dir, env
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "go %s: %s", strings.Join(args, " "), out)
	}
	after, err := os.ReadFile(filepath.Join(dir, "go.work.sum"))
	require.NoError(t, err)
	if !bytes.Equal(before, after) {
		t.Fatalf("go list -m all and go doc changed go.work.sum (%d lines, then %d): run them at the repository's root and commit go.work.sum (never go work sync)",
			bytes.Count(before, []byte("\n")), bytes.Count(after, []byte("\n")))
	}
}
