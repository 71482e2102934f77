package pgcluster

import (
	"os"
	"os/exec"
)

// ServerCommand returns a command that runs name as the OS user the server
// binaries run as (the user postgres when this process is root, since
// PostgreSQL and PgBouncer refuse to run as root; the current user
// otherwise), with the same scrubbed environment as the server tools. Dir,
// when not empty, must be writable by that user.
func ServerCommand(dir, name string, args ...string) (*exec.Cmd, error) {
	cred, err := pgCredential()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = toolEnv(dir)
	runAs(cmd, cred)
	return cmd, nil
}

// ChownToServerUser gives path to the OS user the server binaries run as,
// when that is not the current user.
func ChownToServerUser(path string) error {
	cred, err := pgCredential()
	if err != nil || cred == nil {
		return err
	}
	return os.Chown(path, int(cred.uid), int(cred.gid))
}
