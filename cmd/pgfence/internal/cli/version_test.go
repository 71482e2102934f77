package cli_test

import (
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/cli"
	"github.com/pgfence/pgfence/migrations"
)

// TestVersionAsDocumented: every example of --version in docs/cli.md has
// the form pgfence --version prints and this build's migration version (it
// showed "migrations 2" at version 6), and git ignores what the README's
// Quickstart writes into the clone, so that rebuilding there does not
// report "+dirty".
func TestVersionAsDocumented(t *testing.T) {
	t.Parallel()
	form := regexp.MustCompile(`^pgfence (v\d+\.\d+\.\d+\S*|\(devel\)), migrations (\d+)$`)
	code, out, errOut := run(t, "--version")
	require.Equal(t, cli.ExitOK, code, errOut)
	require.Regexp(t, form, strings.TrimSuffix(out, "\n"))

	doc, err := os.ReadFile("../../../../docs/cli.md")
	require.NoError(t, err)
	row := regexp.MustCompile("(?m)^\\| `--version` \\|.*$").FindString(string(doc))
	require.NotEmpty(t, row, "docs/cli.md documents --version")
	examples := regexp.MustCompile("`(pgfence [^`]*)`").FindAllStringSubmatch(row, -1)
	require.NotEmpty(t, examples)
	for _, ex := range examples {
		m := form.FindStringSubmatch(ex[1])
		require.NotNil(t, m, "not the form --version prints: %q", ex[1])
		n, err := strconv.Atoi(m[2])
		require.NoError(t, err)
		require.Equal(t, int(migrations.Latest), n, "docs/cli.md: %q", ex[1])
	}

	readme, err := os.ReadFile("../../../../README.md")
	require.NoError(t, err)
	quick := string(readme)[strings.Index(string(readme), "## Quickstart"):]
	quick = quick[:strings.Index(quick[3:], "\n## ")+3]
	var written []string
	for _, m := range regexp.MustCompile(`go build -o (\S+)|cat > (\S+)`).FindAllStringSubmatch(quick, -1) {
		written = append(written, m[1]+m[2])
	}
	require.Subset(t, written, []string{"pgfence", "export.sh"}, "what the Quickstart writes into the clone")
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git: cannot check .gitignore")
	}
	if err := exec.Command("git", "-C", "../../../..", "rev-parse", "--git-dir").Run(); err != nil {
		t.Skip("not a git checkout: cannot check .gitignore")
	}
	for _, f := range written {
		out, err := exec.Command("git", "-C", "../../../..", "check-ignore", "--no-index", "-v", f).CombinedOutput()
		require.NoError(t, err, "git does not ignore %s, which the Quickstart writes into the clone (%s)", f, out)
	}
}
