package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	"github.com/testcontainers/testcontainers-go/wait"
)

const (
	defaultDockerImage = "postgres:15-alpine"
	dockerPingTimeout  = 2 * time.Second
	dockerStartTimeout = 5 * time.Minute // includes pulling the image
)

// dockerAvailable answers quickly whether a Docker daemon is there. Without
// any hint of a daemon (no DOCKER_HOST, no known socket, no testcontainers
// configuration) it answers at once; otherwise it pings through
// testcontainers, which knows about Docker contexts and rootless sockets,
// under a short timeout and a recover, because testcontainers panics when it
// finds no Docker host.
func dockerAvailable() error {
	if !dockerHinted() {
		return errors.New("no daemon (DOCKER_HOST unset and no Docker socket found)")
	}
	type result struct{ err error }
	done := make(chan result, 1)
	ctx, cancel := context.WithTimeout(context.Background(), dockerPingTimeout)
	defer cancel()
	go func() {
		var err error
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("no daemon: %v", r)
			}
			done <- result{err}
		}()
		cli, cerr := testcontainers.NewDockerClientWithOpts(ctx)
		if cerr != nil {
			err = fmt.Errorf("no daemon: %w", cerr)
			return
		}
		defer cli.Close()
		if _, perr := cli.Ping(ctx, client.PingOptions{}); perr != nil {
			err = fmt.Errorf("daemon does not answer: %w", perr)
		}
	}()
	select {
	case r := <-done:
		return r.err
	case <-time.After(dockerPingTimeout + 500*time.Millisecond):
		return fmt.Errorf("daemon did not answer within %v", dockerPingTimeout)
	}
}

// dockerHinted reports whether anything suggests a Docker daemon, so that
// machines without Docker skip the (noisy) testcontainers probe entirely.
func dockerHinted() bool {
	if os.Getenv("DOCKER_HOST") != "" || os.Getenv("TESTCONTAINERS_HOST_OVERRIDE") != "" {
		return true
	}
	home, _ := os.UserHomeDir()
	candidates := []string{"/var/run/docker.sock", "/run/docker.sock"}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		candidates = append(candidates, filepath.Join(d, "docker.sock"), filepath.Join(d, "podman", "podman.sock"))
	}
	if home != "" {
		candidates = append(candidates,
			filepath.Join(home, ".docker", "run", "docker.sock"),
			filepath.Join(home, ".docker", "desktop", "docker.sock"),
			filepath.Join(home, ".colima", "default", "docker.sock"),
			filepath.Join(home, ".rd", "docker.sock"),
			filepath.Join(home, ".testcontainers.properties"),
		)
	}
	for _, c := range candidates {
		if _, err := os.Stat(c); err == nil {
			return true
		}
	}
	return false
}

// startDockerServer runs a PostgreSQL container with trust authentication
// (so that URLAs works without passwords) and returns it as the shared
// server; the container is terminated by Main, and by testcontainers' reaper
// if the test binary dies first.
func startDockerServer() (srv *server, err error) {
	image := os.Getenv(EnvDockerImage)
	if image == "" {
		image = defaultDockerImage
	}
	ctx, cancel := context.WithTimeout(context.Background(), dockerStartTimeout)
	defer cancel()

	var ctr *tcpostgres.PostgresContainer
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("testcontainers panicked: %v", r)
		}
		if err != nil && ctr != nil {
			_ = testcontainers.TerminateContainer(ctr)
		}
	}()
	ctr, err = tcpostgres.Run(ctx, image,
		tcpostgres.WithDatabase("postgres"),
		testcontainers.WithEnv(map[string]string{"POSTGRES_HOST_AUTH_METHOD": "trust"}),
		testcontainers.WithCmd("postgres",
			"-c", "fsync=off",
			"-c", "synchronous_commit=off",
			"-c", "full_page_writes=off",
			"-c", "max_connections=300"),
		testcontainers.WithWaitStrategy(
			wait.ForLog("database system is ready to accept connections").
				WithOccurrence(2).WithStartupTimeout(2*time.Minute),
			wait.ForListeningPort("5432/tcp"),
		),
	)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", image, err)
	}
	connURL, err := ctr.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		return nil, fmt.Errorf("connection string of %s: %w", image, err)
	}
	c := ctr
	stop := func() {
		if err := testcontainers.TerminateContainer(c); err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: terminate container: %v\n", err)
		}
	}
	srv, err = openServer("docker", URLFor(connURL, "postgres"), stop)
	if err != nil {
		return nil, err
	}
	return srv, nil
}
