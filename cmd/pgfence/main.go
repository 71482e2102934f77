// Command pgfence applies pgfence's migrations and shows what fencing tokens
// do. Run `pgfence --help` for the commands.
package main

import (
	"context"
	"os"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/cli"
)

func main() {
	ctx, stop := cli.NotifyContext(context.Background())
	code := cli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
