package otelfence_test

import (
	"context"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/otelfence"
)

// A client whose events go to the global meter and tracer providers (set
// them up first, with the SDK and an exporter, as for any instrumented
// library). The test of this package reads every instrument back.
func ExampleNew() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	obs, err := otelfence.New() // otelfence.WithResourceNames() to label metrics by resource
	if err != nil {
		log.Fatal(err)
	}
	client, err := gofence.New(pool, &gofence.Config{Observer: obs})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx)
	// client.Acquire, Do, Elect, lease.Tx, ... as usual: each is measured.
}
