//go:build !unix

package pgcluster

import "os/exec"

// runAs is a no-op off Unix, where the harness never runs as root.
func runAs(*exec.Cmd, *osCred) {}

// processAlive answers true off Unix, so stale clusters are never reaped
// there rather than reaped while in use.
func processAlive(int) bool { return true }
