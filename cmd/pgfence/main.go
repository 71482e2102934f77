// Command pgfence applies pgfence's migrations and shows what fencing tokens
// do. Run `pgfence --help` for the commands.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
