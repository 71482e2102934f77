package integration

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// Fuzz tests of the SQL surface with hostile input. Each fuzz function
// shares one migrated database across its inputs; the test command runs the
// seed corpora (f.Add below and testdata/fuzz/<FuzzName>/) only. To fuzz:
//
//	go test ./integration -run '^$' -fuzz FuzzAcquireArgs -fuzztime 2m
//
// Every input must either work as documented or fail with the documented
// SQLSTATE, and must change nothing but what it names: a canary lease (and
// for protect a canary table) is compared before and after each input.

const fuzzCanary = "fuzz/canary"

// sqlState returns the SQLSTATE of err ("" when err is nil, "?" when err is
// not a PostgreSQL error).
func sqlState(err error) string {
	if err == nil {
		return ""
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return "?"
}

// nameError is the SQLSTATE documented for a resource, holder or lock name:
// 22021 when PostgreSQL cannot take the bytes as text (invalid UTF-8, NUL),
// 22023 when empty, 22001 over 255 characters; "" when the name is valid.
func nameError(s string) string {
	switch {
	case !utf8.ValidString(s) || strings.ContainsRune(s, 0):
		return "22021"
	case s == "":
		return "22023"
	case utf8.RuneCountInString(s) > 255:
		return "22001"
	}
	return ""
}

// leaseSnapshot renders every row of fence.lease except skip's, so that a
// change to any other resource shows.
func leaseSnapshot(t *testing.T, ctx context.Context, db sqlfuncs.DB, skip string) string {
	t.Helper()
	var s string
	require.NoError(t, db.QueryRow(ctx, `SELECT coalesce(string_agg(l::text, E'\n' ORDER BY l.resource), '')
		FROM fence.lease l WHERE l.resource IS DISTINCT FROM $1`, skipArg(skip)).Scan(&s))
	return s
}

// skipArg is skip as a query argument that PostgreSQL can decode: a name
// that is not valid text cannot be the resource of any row.
func skipArg(skip string) any {
	if nameError(skip) == "22021" {
		return nil
	}
	return skip
}

// fuzzDB is the shared database of a fuzz function with a canary lease.
func fuzzDB(f *testing.F) (*pgtest.DB, context.Context) {
	f.Helper()
	db := pgtest.Setup(f)
	ctx := context.Background()
	_, ok, err := sqlfuncs.Acquire(ctx, db.Pool, fuzzCanary, "canary", 24*time.Hour)
	require.NoError(f, err)
	require.True(f, ok)
	return db, ctx
}

// FuzzAcquireArgs: fence.acquire with any resource, holder and TTL, through
// sqlfuncs.Acquire. Valid input grants a lease whose row says exactly what
// was asked (holder, TTL by the server clock) and whose token exceeds every
// earlier token of the resource; invalid input fails with 22021, 22023 or
// 22001 and changes nothing.
func FuzzAcquireArgs(f *testing.F) {
	f.Add("r", "h", int64(time.Second))
	f.Add("", "h", int64(time.Second))
	f.Add("r", "", int64(time.Second))
	f.Add("with\x00nul", "h", int64(time.Second))
	f.Add("r", "h\x00", int64(time.Second))
	f.Add("\xff\xfe invalid", "h", int64(time.Second))
	f.Add("r", "\xc3\x28", int64(time.Second))
	f.Add("'); SELECT fence.revoke('fuzz/canary'); --", `\'; DROP SCHEMA fence CASCADE; --`, int64(time.Minute))
	f.Add(fuzzCanary, "thief", int64(time.Second))
	f.Add(strings.Repeat("é", 255), strings.Repeat("x", 255), int64(time.Second))
	f.Add(strings.Repeat("é", 256), "h", int64(time.Second))
	f.Add("r", strings.Repeat("y", 1<<20), int64(time.Second))
	f.Add("ttl-min", "h", int64(10*time.Millisecond))
	f.Add("ttl-below", "h", int64(10*time.Millisecond-time.Microsecond))
	f.Add("ttl-below-ns", "h", int64(10*time.Millisecond-1)) // truncated to 9999µs
	f.Add("ttl-max", "h", int64(24*time.Hour))
	f.Add("ttl-above", "h", int64(24*time.Hour+time.Microsecond))
	f.Add("ttl-zero", "h", int64(0))
	f.Add("ttl-negative", "h", int64(-time.Second))
	f.Add("ttl-maxint", "h", int64(math.MaxInt64))
	f.Add("ttl-minint", "h", int64(math.MinInt64))
	f.Add("emoji 🔒", "holder 🔑", int64(time.Second))

	db, ctx := fuzzDB(f)
	latest := map[string]int64{}
	f.Fuzz(func(t *testing.T, resource, holder string, ttlNS int64) {
		ttl := time.Duration(ttlNS)
		others := leaseSnapshot(t, ctx, db.Pool, resource)
		tok, ok, err := sqlfuncs.Acquire(ctx, db.Pool, resource, holder, ttl)

		want := nameError(resource)
		if he := nameError(holder); want == "" || he == "22021" {
			want = cmpOr(he, want)
		}
		if want == "" && (ttl.Microseconds() < 10_000 || ttl.Microseconds() > 86_400_000_000) {
			want = "22023"
		}
		require.Equal(t, want, sqlState(err), "acquire(%q, %q, %s): %v", resource, holder, ttl, err)
		require.Equal(t, others, leaseSnapshot(t, ctx, db.Pool, resource), "other resources changed")
		if err != nil {
			return
		}
		if !ok {
			require.Equal(t, fuzzCanary, resource, "only the canary is held, yet %q was not granted", resource)
			return
		}
		require.Greater(t, tok, latest[resource], "token of %q", resource)
		latest[resource] = tok
		var gotHolder, kind string
		var live bool
		var span time.Duration
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT holder, kind, live, expires_at - acquired_at FROM fence.leases
			WHERE resource = $1 AND token = $2`, resource, tok).Scan(&gotHolder, &kind, &live, &span))
		require.Equal(t, holder, gotHolder)
		require.Equal(t, "ttl", kind)
		require.Equal(t, ttl.Truncate(time.Microsecond), span, "expires_at - acquired_at is the TTL")
		released, err := sqlfuncs.Release(ctx, db.Pool, resource, tok)
		require.NoError(t, err)
		// A 10ms lease may have expired by now; then there is nothing to release.
		require.True(t, released || ttl < time.Second, "release of a live lease")
	})
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// FuzzTokens: fence.check, fence.use_token, fence.renew and fence.release
// with any token (0, negative, max int64, near the live token) on a resource
// with a live lease and on one never granted. Answers follow docs/sql.md:
// check and use_token raise FN003 for non-positive and never-granted tokens
// and FN001 for older ones; renew and release raise 22023 for non-positive
// tokens and otherwise answer NULL/false unless the token is the live one.
// No input touches the canary or grants the never-granted resource.
func FuzzTokens(f *testing.F) {
	const first = 1<<43 | 1 // the first token of a resource on timeline 1
	for _, tok := range []int64{0, -1, math.MinInt64, math.MaxInt64, 1, first - 1, first, first + 1, 1 << 62} {
		for op := range uint8(8) {
			f.Add(tok, op)
		}
	}
	db, ctx := fuzzDB(f)
	const live, never = "fuzz/live", "fuzz/never"
	cur, ok, err := sqlfuncs.Acquire(ctx, db.Pool, live, "holder", time.Hour)
	require.NoError(f, err)
	require.True(f, ok)
	// The canary took the first token of the install; tokens are unique
	// across resources, so this resource's first grant is the next one.
	// (The database is a copy of a migrated template, so its epoch is not
	// the first one: a copy starts a new epoch.)
	require.Equal(f, int64(2), counterOf(cur), "second token of a fresh install")

	f.Fuzz(func(t *testing.T, tok int64, op uint8) {
		res := live
		if op&4 != 0 {
			res = never
		}
		others := leaseSnapshot(t, ctx, db.Pool, live)
		var before time.Time
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT expires_at FROM fence.leases WHERE resource = $1`, live).Scan(&before))
		isLive := res == live && tok == cur
		switch op & 3 {
		case 0, 1: // check, use_token (in a transaction)
			if op&3 == 0 {
				err = sqlfuncs.Check(ctx, db.Pool, res, tok)
			} else {
				err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return sqlfuncs.UseToken(ctx, tx, res, tok) })
			}
			want := ""
			switch {
			case tok <= 0 || res == never || tok > cur:
				want = sqlfuncs.CodeUnknownToken
			case tok < cur:
				want = sqlfuncs.CodeStaleToken
			}
			require.Equal(t, want, sqlState(err), "check(%s, %d) with latest %d: %v", res, tok, cur, err)
		case 2:
			exp, ok, err := sqlfuncs.Renew(ctx, db.Pool, res, tok, time.Hour)
			if tok <= 0 {
				require.Equal(t, "22023", sqlState(err), "renew(%s, %d): %v", res, tok, err)
				break
			}
			require.NoError(t, err)
			require.Equal(t, isLive, ok, "renew(%s, %d) with live token %d", res, tok, cur)
			if ok {
				require.False(t, exp.Before(before), "renewal moved the expiry back")
			}
		case 3:
			released, err := sqlfuncs.Release(ctx, db.Pool, res, tok)
			if tok <= 0 {
				require.Equal(t, "22023", sqlState(err), "release(%s, %d): %v", res, tok, err)
				break
			}
			require.NoError(t, err)
			require.Equal(t, isLive, released, "release(%s, %d) with live token %d", res, tok, cur)
			if released {
				next, ok, err := sqlfuncs.Acquire(ctx, db.Pool, live, "holder", time.Hour)
				require.NoError(t, err)
				require.True(t, ok, "a released resource can be acquired again")
				require.Greater(t, next, cur)
				cur = next
			}
		}
		require.Equal(t, others, leaseSnapshot(t, ctx, db.Pool, live), "the canary or another resource changed")
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM fence.leases WHERE resource = $1`, never).Scan(&n))
		require.Zero(t, n, "a token operation created a lease for a resource never granted")
		var token int64
		var alive bool
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT token, live FROM fence.leases WHERE resource = $1`, live).Scan(&token, &alive))
		require.Equal(t, cur, token, "the live lease's token")
		require.True(t, alive, "the live lease is still live")
	})
}

// FuzzProtectNames: fence.protect as an application role, with table,
// column and resource strings that try SQL injection. fence.protect takes
// the table as regclass (parsed by PostgreSQL) and the column as name, and
// quotes both with format('%I') and the resource with format('%L'). Success
// means: the named table (and only it) has the two guard triggers, for
// exactly that resource and column, and a write without a token is refused
// (FN002). Failure means one of the documented SQLSTATEs and no change to
// any trigger, table or lease.
func FuzzProtectNames(f *testing.F) {
	for _, s := range [][3]string{
		{"plain", "tok", "r"},
		{"plain", "", "r"},
		{"public.plain", "label", "r"},
		{"plain", "small", "r"},
		{"plain", "xmin", "r"},
		{"plain", "nope", "r"},
		{"nope", "tok", "r"},
		{"plain; DROP TABLE plain", "tok", "r"},
		{`"x; DROP TABLE plain; --"`, "tok", "r"},
		{`"Mixed Case"`, "tok", "r"},
		{"Mixed Case", "tok", "r"},
		{`"q'uote"`, `to"k`, "r"},
		{`"q'uote"`, `tok'); DROP TABLE plain; --`, "r"},
		{"plain", `tok"; DROP TABLE plain; --`, "r"},
		{"plain", "tok", `r'); DROP TABLE plain; --`},
		{"plain", "tok", `\'); SELECT fence.revoke('fuzz/canary'); --`},
		{"canary", "tok", "r"},
		{"fence.lease", "token", "r"},
		{"pg_catalog.pg_class", "", "r"},
		{"pg_tables", "", "r"},
		{"nodb.public.plain", "tok", "r"},
		{"a.b.c.d", "tok", "r"},
		{"noschema.plain", "tok", "r"},
		{"1259", "", "r"},
		{"987654321", "", "r"},
		{"", "tok", "r"},
		{"plain\x00", "tok", "r"},
		{"plain", "tok\x00", "r"},
		{"plain", "tok", "\xff"},
		{"plain", "tok", ""},
		{"plain", "tok", strings.Repeat("r", 256)},
		{"plain", strings.Repeat("t", 64), "r"},
		{strings.Repeat("p", 70), "tok", "r"},
	} {
		f.Add(s[0], s[1], s[2])
	}

	db := pgtest.Setup(f)
	ctx := context.Background()
	app := pgtest.NewRole(f, "fuzzapp")
	exec := func(conn sqlfuncs.DB, sql string) {
		_, err := conn.Exec(ctx, sql)
		require.NoError(f, err, sql)
	}
	exec(db.Pool, `GRANT CREATE ON SCHEMA public TO `+pgx.Identifier{app}.Sanitize())
	exec(db.Pool, `CREATE TABLE public.canary (tok bigint)`)
	require.NoError(f, sqlfuncs.Protect(ctx, db.Pool, "public.canary", fuzzCanary, "tok"))
	require.NoError(f, sqlfuncs.GrantUsage(ctx, db.Pool, app, false))
	_, ok, err := sqlfuncs.Acquire(ctx, db.Pool, fuzzCanary, "canary", 24*time.Hour)
	require.NoError(f, err)
	require.True(f, ok)
	appConn, err := pgx.Connect(ctx, db.URLAs(app))
	require.NoError(f, err)
	f.Cleanup(func() { _ = appConn.Close(context.Background()) })
	for _, sql := range []string{
		`CREATE TABLE public.plain (id int, tok bigint, label text, small int)`,
		`CREATE TABLE public."Mixed Case" (tok bigint)`,
		`CREATE TABLE public."x; DROP TABLE plain; --" (tok bigint)`,
		`CREATE TABLE public."q'uote" ("to""k" bigint, "tok'); DROP TABLE plain; --" bigint)`,
	} {
		exec(appConn, sql)
	}

	snapshot := func(t *testing.T, skip uint32) string {
		t.Helper()
		var s string
		require.NoError(t, db.Pool.QueryRow(ctx, `
			SELECT coalesce((SELECT string_agg(format('%s %s %s %s', tgrelid::regclass, tgname, tgenabled, encode(tgargs, 'hex')), E'\n' ORDER BY 1)
			                   FROM pg_trigger WHERE NOT tgisinternal AND tgrelid <> $1::oid), '')
			       || E'\n--\n' || (SELECT string_agg(oid::regclass::text, E'\n' ORDER BY oid) FROM pg_class WHERE relnamespace = 'public'::regnamespace)
			       || E'\n--\n' || (SELECT string_agg(l::text, E'\n' ORDER BY resource) FROM fence.lease l)`, skip).Scan(&s))
		return s
	}
	allowed := []string{
		"22021",          // invalid UTF-8 or NUL in any argument
		"22023", "22001", // empty or over-long resource
		"42P01", "42602", "42601", // unknown table, invalid or improper name
		"22003",          // a number beyond the oid range, which regclass reads as an OID
		"3F000", "0A000", // unknown schema, cross-database reference
		"42703", "42804", // unknown or system column, column not bigint
		"42809", // not an ordinary table (view, catalog view, the kit's own tables)
		"42501", // not the owner (catalogs, the kit's tables, the canary)
	}

	f.Fuzz(func(t *testing.T, table, column, resource string) {
		before := snapshot(t, 0)
		err := sqlfuncs.Protect(ctx, appConn, table, resource, column)
		if err != nil {
			require.Contains(t, allowed, sqlState(err), "protect(%q, %q, %q): %v", table, resource, column, err)
			require.Equal(t, before, snapshot(t, 0), "a failed protect changed something")
			return
		}
		var oid uint32
		require.NoError(t, appConn.QueryRow(ctx, `SELECT $1::regclass::oid`, table).Scan(&oid))
		var name string
		var triggers []string
		require.NoError(t, appConn.QueryRow(ctx, `SELECT $1::oid::regclass::text, array_agg(tgname::text ORDER BY tgname::text COLLATE "C")
			FROM pg_trigger WHERE tgrelid = $1::oid AND NOT tgisinternal`, oid).Scan(&name, &triggers))
		want := []string{"zz_fence_guard_stmt", "~fence_guard_0_mark", "~fence_guard_1_row"}
		if column == "" {
			want = []string{"zz_fence_guard_stmt", "~fence_guard_1_row"}
		}
		require.Equal(t, want, triggers, "triggers on %s", name)
		var gotRes string
		var gotCol *string
		require.NoError(t, appConn.QueryRow(ctx, `SELECT resource, token_column::text FROM fence.protected WHERE tbl = $1::oid::regclass`, oid).
			Scan(&gotRes, &gotCol))
		require.Equal(t, resource, gotRes, "the guard's resource is the argument, byte for byte")
		if column == "" {
			require.Nil(t, gotCol)
		} else {
			require.NotNil(t, gotCol)
			require.Equal(t, truncateName(column), *gotCol)
		}
		_, err = appConn.Exec(ctx, `INSERT INTO `+name+` DEFAULT VALUES`)
		require.Equal(t, sqlfuncs.CodeNoToken, sqlState(err), "a write without a token to %s: %v", name, err)
		require.Equal(t, stripTable(before, name), stripTable(snapshot(t, oid), name), "protect of %s changed another table", name)
		require.NoError(t, sqlfuncs.Unprotect(ctx, appConn, name))
		require.Equal(t, before, snapshot(t, 0), "unprotect left something behind")
	})
}

// truncateName is what PostgreSQL makes of an identifier longer than
// NAMEDATALEN-1 bytes: the longest prefix of at most 63 bytes that ends on a
// character boundary.
func truncateName(s string) string {
	if len(s) <= 63 {
		return s
	}
	n := 63
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// stripTable drops the trigger lines of table from a snapshot.
func stripTable(snap, table string) string {
	lines := strings.Split(snap, "\n")
	return strings.Join(slices.DeleteFunc(lines, func(l string) bool { return strings.HasPrefix(l, table+" zz_fence_guard_") }), "\n")
}
