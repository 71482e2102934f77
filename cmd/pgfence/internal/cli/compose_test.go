package cli_test

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// TestComposeFileMatchesTheREADME: there is no Docker engine on the
// development machines, so the compose file is checked by reading it: the
// service, image, port and health check the README's quickstart relies on.
func TestComposeFileMatchesTheREADME(t *testing.T) {
	raw, err := os.ReadFile("../../../../docker-compose.yml")
	require.NoError(t, err)
	var compose struct {
		Services map[string]struct {
			Image       string            `yaml:"image"`
			Environment map[string]string `yaml:"environment"`
			Ports       []string          `yaml:"ports"`
			Healthcheck struct {
				Test []string `yaml:"test"`
			} `yaml:"healthcheck"`
		} `yaml:"services"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &compose))
	pg, ok := compose.Services["postgres"]
	require.True(t, ok, "a service named postgres")
	require.True(t, strings.HasPrefix(pg.Image, "postgres:"), pg.Image)
	require.Contains(t, pg.Ports, "5432:5432")
	require.Equal(t, "trust", pg.Environment["POSTGRES_HOST_AUTH_METHOD"])
	require.Contains(t, strings.Join(pg.Healthcheck.Test, " "), "pg_isready")

	readme, err := os.ReadFile("../../../../README.md")
	require.NoError(t, err)
	for _, want := range []string{"docker compose up -d --wait", "postgres://postgres@localhost:5432/postgres", pg.Image} {
		require.Contains(t, string(readme), want, "the README's quickstart and docker-compose.yml disagree")
	}
}
