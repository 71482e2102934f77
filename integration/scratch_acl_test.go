package integration

import (
	"testing"

	"github.com/pgfence/pgfence/internal/pgtest"
)

func TestScratchACL(t *testing.T) {
	ctx := testContext(t)
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{NoMigrate: true})
	conn := connect(t, ctx, c.URL(), false)
	rows, err := conn.Query(ctx, "SELECT proname, coalesce(proacl::text,'<default: public>') FROM pg_proc WHERE proname IN ('pg_control_system','pg_walfile_name','pg_current_wal_lsn')")
	if err != nil { t.Fatal(err) }
	for rows.Next() { var a, b string; rows.Scan(&a, &b); t.Log(a, b) }
}
