package cli_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// TestDoctorChecksThatRefusalsReachTheServerLog (issue 22, item 4), on a
// cluster of its own (ALTER SYSTEM is the server's): with PostgreSQL's
// default log_line_prefix a refusal is logged without its SQLSTATE, and
// doctor says so with the prefix to set; once it has %e (or, on 15 and
// later, jsonlog is written) doctor is content, and the log shows a refused
// write's SQLSTATE and statement; log_min_error_statement above error and
// log_min_messages above error are each reported. pg_stat_statements
// counts the executions of a statement that succeeded only: a refused one
// leaves no trace there.
func TestDoctorChecksThatRefusalsReachTheServerLog(t *testing.T) {
	t.Parallel()
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{Config: map[string]string{"shared_preload_libraries": "'pg_stat_statements'"}})
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, c.URL())
	require.NoError(t, err)
	defer func() { _ = conn.Close(context.Background()) }()
	exec := func(sql string) {
		t.Helper()
		_, err := conn.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	// set changes a setting of the server and waits until new sessions
	// (doctor's) see it.
	set := func(name, value string) {
		t.Helper()
		exec(`ALTER SYSTEM SET ` + name + ` = '` + value + `'`)
		exec(`SELECT pg_reload_conf()`)
		require.EventuallyWithT(t, func(ct *assert.CollectT) {
			fresh, err := pgx.Connect(ctx, c.URL())
			if !assert.NoError(ct, err) {
				return
			}
			defer fresh.Close(context.Background())
			var got string
			if assert.NoError(ct, fresh.QueryRow(ctx, `SELECT current_setting($1)`, name).Scan(&got)) {
				assert.Equal(ct, value, got)
			}
		}, 10*time.Second, 20*time.Millisecond)
	}
	check := func() []finding {
		t.Helper()
		return doctorList(t, c.URL(), "server log")
	}
	exec(`CREATE TABLE report (body text, tok bigint)`)
	require.NoError(t, sqlfuncs.Protect(ctx, conn, "report", "report", "tok"))
	// refuse makes a stale write (FN001) with a marker of its own.
	refuse := func(marker string) {
		t.Helper()
		tok, ok, err := sqlfuncs.Acquire(ctx, conn, "report", "a", time.Minute)
		require.NoError(t, err)
		require.True(t, ok)
		_, err = sqlfuncs.Revoke(ctx, conn, "report")
		require.NoError(t, err)
		_, err = conn.Exec(ctx, `INSERT INTO report VALUES ('`+marker+`', $1)`, tok)
		require.ErrorIs(t, sqlfuncs.Translate(err), sqlfuncs.ErrStaleToken)
	}

	t.Run("pg_stat_statements does not count a refused statement", func(t *testing.T) {
		exec(`CREATE EXTENSION pg_stat_statements`)
		const insert = `INSERT INTO report VALUES ($1, $2)`
		tok, ok, err := sqlfuncs.Acquire(ctx, conn, "report", "a", time.Minute)
		require.NoError(t, err)
		require.True(t, ok)
		exec(`SELECT pg_stat_statements_reset()`)
		_, err = conn.Exec(ctx, insert, "accepted", tok)
		require.NoError(t, err)
		_, err = sqlfuncs.Revoke(ctx, conn, "report")
		require.NoError(t, err)
		_, err = conn.Exec(ctx, insert, "refused", tok)
		require.ErrorIs(t, sqlfuncs.Translate(err), sqlfuncs.ErrStaleToken)
		var calls int64
		require.NoError(t, conn.QueryRow(ctx, `SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements WHERE query = $1`, insert).Scan(&calls))
		require.Equal(t, int64(1), calls, "two executions, one refused")
		rs, err := sqlfuncs.Refusals(ctx, conn)
		require.NoError(t, err)
		require.Equal(t, "FN001", rs[0].SQLState)
		require.Equal(t, int64(1), rs[0].Count, "fence.refusals counts it")
	})

	var prefix string
	require.NoError(t, conn.QueryRow(ctx, `SELECT current_setting('log_line_prefix')`).Scan(&prefix))
	require.NotContains(t, prefix, "%e", "PostgreSQL's default")
	fs := check()
	require.Len(t, fs, 1)
	require.Equal(t, "warn", fs[0].Status)
	require.Contains(t, fs[0].Detail, "without their SQLSTATE")
	want := strings.TrimRight(prefix, " ") + " %e "
	require.Contains(t, fs[0].Fix, "ALTER SYSTEM SET log_line_prefix = '"+want+"'; SELECT pg_reload_conf()")

	set("log_line_prefix", want)
	fs = check()
	require.Len(t, fs, 1)
	require.Equal(t, "ok", fs[0].Status, fs[0].Detail)
	require.Contains(t, fs[0].Detail, "log_line_prefix has %e")
	refuse("by-prefix")
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		b, err := os.ReadFile(c.Logfile())
		if assert.NoError(ct, err) {
			assert.Regexp(ct, `(?s)\] FN001 ERROR:  pgfence: stale fencing token .*?\] FN001 STATEMENT:  INSERT INTO report VALUES \('by-prefix', \$1\)`, string(b))
		}
	}, 10*time.Second, 20*time.Millisecond, "the server log shows the refusal's SQLSTATE and statement")

	set("log_min_error_statement", "log")
	fs = check()
	require.Len(t, fs, 1)
	require.Equal(t, "warn", fs[0].Status)
	require.Contains(t, fs[0].Detail, "log_min_error_statement = log: a refused write is logged without its statement")
	require.Contains(t, fs[0].Fix, "ALTER SYSTEM SET log_min_error_statement = error")
	set("log_min_error_statement", "error")

	set("log_min_messages", "fatal")
	fs = check()
	require.Len(t, fs, 1)
	require.Equal(t, "warn", fs[0].Status)
	require.Contains(t, fs[0].Detail, "log_min_messages = fatal: refused writes (ERROR) do not reach the server log")
	set("log_min_messages", "warning")

	var version int
	require.NoError(t, conn.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version))
	if version < 150000 {
		return // jsonlog exists from PostgreSQL 15 on
	}
	exec(`ALTER SYSTEM SET log_line_prefix = '` + strings.ReplaceAll(prefix, "'", "''") + `'`)
	exec(`ALTER SYSTEM SET log_destination = 'jsonlog'`)
	exec(`ALTER SYSTEM SET logging_collector = on`) // needs a restart
	_ = conn.Close(ctx)
	c.Restart(t, "fast")
	conn, err = pgx.Connect(ctx, c.URL())
	require.NoError(t, err)
	fs = check()
	require.Len(t, fs, 1)
	require.Equal(t, "ok", fs[0].Status, fs[0].Detail)
	require.Contains(t, fs[0].Detail, "jsonlog writes it as state_code")
	refuse("by-jsonlog")
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		files, err := filepath.Glob(filepath.Join(c.DataDir(), "log", "*.json"))
		if !assert.NoError(ct, err) || !assert.NotEmpty(ct, files) {
			return
		}
		var all strings.Builder
		for _, f := range files {
			b, err := os.ReadFile(f)
			assert.NoError(ct, err)
			all.Write(b)
		}
		assert.Regexp(ct, `"state_code":"FN001","message":"pgfence: stale fencing token [^"]*",.*"statement":"INSERT INTO report VALUES \('by-jsonlog', \$1\)"`, all.String())
	}, 10*time.Second, 20*time.Millisecond, "jsonlog shows the refusal's SQLSTATE and statement")
}
