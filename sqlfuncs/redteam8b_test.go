package sqlfuncs_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// The tests in this file come from a second, short red team of migration
// 008, aimed at its two changes: every gate taken in a subtransaction of
// its own (a PL/pgSQL block with an exception handler), and the read-only
// exemption of fence._check (a READ ONLY transaction under REPEATABLE READ
// or SERIALIZABLE reads the lease row without FOR KEY SHARE). Each test
// passes while the kit refuses; a bypass fails it with "BYPASS:".

// rt8bFixture is an application role with usage, its connection, and three
// guarded tables: rt_cols (table-wide, token column, resource rtc), rt_plain
// (table-wide, fence.use_token, resource rtp) and rt_rows (per-row, token
// column, resources rtj:<job>); rt_free is unprotected.
type rt8bFixture struct {
	b    *bundle
	role string
	ac   *pgx.Conn
}

func rt8bSetup(t *testing.T, prefix string) *rt8bFixture {
	t.Helper()
	b := setup(t)
	ctx := b.ctx
	app := pgtest.NewRole(t, prefix)
	rt8bTables(t, ctx, b.db.Pool, app)
	return &rt8bFixture{b: b, role: app, ac: roleConn(t, b, app)}
}

// rt8bTables gives app the kit's usage and creates, as db's role, the
// fixture's tables, granted to app: rt_cols (table-wide, resource rtc, token
// column tok), rt_plain (table-wide, rtp, fence.use_token), rt_rows
// (per-row, rtj:<job>, tok) and rt_free (unprotected).
func rt8bTables(t *testing.T, ctx context.Context, db sqlfuncs.DB, app string) {
	t.Helper()
	require.NoError(t, sqlfuncs.GrantUsage(ctx, db, app, false))
	for _, s := range []string{
		`CREATE TABLE rt_cols (id int PRIMARY KEY, tok bigint, val text)`,
		`CREATE TABLE rt_plain (id int PRIMARY KEY, val text)`,
		`CREATE TABLE rt_rows (id int PRIMARY KEY, job int NOT NULL, tok bigint, val text)`,
		`CREATE TABLE rt_free (id int PRIMARY KEY, val text)`,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON rt_cols, rt_plain, rt_rows, rt_free TO ` + pgx.Identifier{app}.Sanitize(),
	} {
		_, err := db.Exec(ctx, s)
		require.NoError(t, err, s)
	}
	require.NoError(t, sqlfuncs.Protect(ctx, db, "rt_cols", "rtc", "tok"))
	require.NoError(t, sqlfuncs.Protect(ctx, db, "rt_plain", "rtp", ""))
	require.NoError(t, sqlfuncs.ProtectRows(ctx, db, "rt_rows", "job", "rtj:", "tok"))
}

// rt8bResource names form's resource for row id (per-row: one job per id).
func rt8bResource(form string, id int) string {
	switch form {
	case "cols":
		return "rtc"
	case "plain":
		return "rtp"
	}
	return fmt.Sprintf("rtj:%d", id)
}

// rt8bInsert is an INSERT of row id into form's table under token tok whose
// rows come from src (a FROM item evaluated before the row is written).
func rt8bInsert(form string, id int, tok int64, src string) string {
	switch form {
	case "cols":
		return fmt.Sprintf(`INSERT INTO rt_cols SELECT %d, %d, 'A' FROM %s`, id, tok, src)
	case "plain":
		return fmt.Sprintf(`INSERT INTO rt_plain SELECT %d, 'A' FROM %s`, id, src)
	}
	return fmt.Sprintf(`INSERT INTO rt_rows SELECT %d, %d, %d, 'A' FROM %s`, id, id, tok, src)
}

// committed reports whether row id of table is committed.
func (f *rt8bFixture) committed(t *testing.T, table string, id int) bool {
	t.Helper()
	var n int
	require.NoError(t, f.b.db.Pool.QueryRow(f.b.ctx, fmt.Sprintf(`SELECT count(*) FROM %s WHERE id = $1`, pgx.Identifier{table}.Sanitize()), id).Scan(&n))
	return n > 0
}

// rt8bCode is err's SQLSTATE, or err's text when it is not a server error.
func rt8bCode(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code + " " + pgErr.Message
	}
	return err.Error()
}

// TestRedteam8bReadOnlyTurnedOnMidStatement: the read-only exemption of
// fence._check rests on "a read-only transaction commits no write". But
// transaction_read_only may be turned on at any moment (only the way back
// is refused after the first snapshot), and PostgreSQL checks it when a
// statement starts, not when it writes a row. A's REPEATABLE READ (or
// SERIALIZABLE) transaction takes its snapshot while t1 is the latest token;
// a grant of t2 then commits; A runs an INSERT whose FROM item calls
// set_config('transaction_read_only', 'on', true) before the row reaches
// the guard. The guard's check then sees transaction_read_only = on, reads
// the lease row from A's old snapshot without FOR KEY SHARE, finds t1 the
// latest, and the row is written; A commits (a read-only transaction may
// commit what it wrote). Run inside a savepoint that is then released, the
// same INSERT leaves the transaction read-write again, free to write on.
// SPEC guarantee 3: once t2 has been granted, no write under t1 commits.
// Found open on PostgreSQL 15 and 13 for the table-wide guards (rt_cols,
// rt_plain); the per-row guard refuses (25006: its FOR KEY SHARE).
func TestRedteam8bReadOnlyTurnedOnMidStatement(t *testing.T) {
	t.Parallel()
	f := rt8bSetup(t, "rt8bro")
	ctx := f.b.ctx
	id := 0
	for _, form := range []string{"cols", "plain", "rows"} {
		for _, iso := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
			for _, how := range []string{"set_config in the FROM item", "the same in a released savepoint, then more writes"} {
				id++
				t.Run(fmt.Sprintf("%s/%s/%s", form, iso, how), func(t *testing.T) {
					res := rt8bResource(form, id)
					_, err := sqlfuncs.Revoke(ctx, f.b.db.Pool, res)
					require.NoError(t, err)
					t1 := acquireWhenFree(t, ctx, f.ac, res, "A", time.Hour)

					_, err = f.ac.Exec(ctx, `BEGIN ISOLATION LEVEL `+isoSQL(iso))
					require.NoError(t, err)
					defer func() { _, _ = f.ac.Exec(context.WithoutCancel(ctx), `ROLLBACK`) }()
					// The snapshot, taken while t1 is the latest; the token
					// is registered by hand (the guard checks it anyway).
					_, err = f.ac.Exec(ctx, `SELECT set_config('fence.tokens', $1, true)`, fmt.Sprintf(`{"%s": %d}`, res, t1))
					require.NoError(t, err)

					t2, err := revokeWithin(ctx, f.b.db.Pool, res, "2s")
					require.NoError(t, err, "A holds no gate yet: the grant returns")

					write := rt8bInsert(form, id, t1, `(SELECT pg_catalog.set_config('transaction_read_only', 'on', true)) ro`)
					inSavepoint := how != "set_config in the FROM item"
					if inSavepoint {
						// PostgreSQL restores the read-only state when a
						// subtransaction ends (CommitSubTransaction:
						// XactReadOnly = prevXactReadOnly), without the check
						// hook that refuses the way back after the first
						// snapshot: the transaction is read-write again.
						_, err = f.ac.Exec(ctx, `SAVEPOINT s`)
						require.NoError(t, err)
					}
					_, werr := f.ac.Exec(ctx, write)
					if werr != nil {
						t.Logf("refused: %s", rt8bCode(werr))
						return
					}
					ro := "on"
					if inSavepoint {
						_, err = f.ac.Exec(ctx, `RELEASE SAVEPOINT s`)
						require.NoError(t, err)
						require.NoError(t, f.ac.QueryRow(ctx, `SHOW transaction_read_only`).Scan(&ro))
						_, err = f.ac.Exec(ctx, fmt.Sprintf(`INSERT INTO rt_free VALUES (%d, 'A')`, id))
						require.NoError(t, err, "a later write of the same transaction (transaction_read_only=%s)", ro)
					}
					_, cerr := f.ac.Exec(ctx, `COMMIT`)
					table := "rt_" + form
					if cerr == nil && f.committed(t, table, id) {
						t.Errorf("BYPASS: (%s, %s) the grant of token %d returned first; A's INSERT under token %d, with transaction_read_only turned on inside the statement, then passed the guard and committed (%s row %d; transaction_read_only=%s at COMMIT)",
							form, iso, t2, t1, table, id, ro)
						return
					}
					t.Logf("refused at COMMIT: %v", cerr)
				})
			}
		}
	}
}

// TestRedteam8bReadOnlyWrapperAroundCheck: fence.check (or fence.use_token)
// runs in a read-only state that ends right after it, without the check
// hook that refuses the way back to read-write after the first snapshot:
// in a function of the caller's with SET transaction_read_only = on
// (leaving a function restores the setting), or after SET LOCAL in a
// savepoint that is then released (a subtransaction's end restores the
// read-only state it began with). Under REPEATABLE READ or SERIALIZABLE with a snapshot
// older than the grant, the check then accepts the superseded token; the
// caller writes an unprotected table it meant to fence by fence.check, and
// writes rt_plain after fence.use_token. Found open (fence.check) on
// PostgreSQL 15 and 13; after fence.use_token the guard of rt_plain, which
// checks again read-write, refuses the write (40001).
func TestRedteam8bReadOnlyWrapperAroundCheck(t *testing.T) {
	t.Parallel()
	f := rt8bSetup(t, "rt8bwrap")
	ctx := f.b.ctx
	// PostgreSQL 16 and later refuse SET transaction_read_only in a
	// function's definition (0A000): there only the savepoint route is left.
	funcSet := true
	for _, s := range []string{
		`CREATE FUNCTION pg_temp.ro_check(r text, t bigint) RETURNS void LANGUAGE sql SET transaction_read_only = on AS $$ SELECT fence.check(r, t) $$`,
		`CREATE FUNCTION pg_temp.ro_use(r text, t bigint) RETURNS void LANGUAGE sql SET transaction_read_only = on AS $$ SELECT fence.use_token(r, t) $$`,
	} {
		_, err := f.ac.Exec(ctx, s)
		if err != nil && strings.HasPrefix(rt8bCode(err), "0A000") && serverVersion(t, ctx, f.b.db.Pool) >= 160000 {
			funcSet = false
			continue
		}
		require.NoError(t, err, s)
	}
	id := 0
	for _, fn := range []string{"check", "use_token"} {
		for _, iso := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
			for _, how := range []string{"function with SET", "SET LOCAL in a released savepoint"} {
				id++
				t.Run(fmt.Sprintf("%s/%s/%s", fn, iso, how), func(t *testing.T) {
					if how == "function with SET" && !funcSet {
						t.Skip("PostgreSQL 16 and later refuse SET transaction_read_only in a function (0A000)")
					}
					res := fmt.Sprintf("rtw%d", id)
					table, write := "rt_free", fmt.Sprintf(`INSERT INTO rt_free VALUES (%d, 'A')`, id)
					if fn == "use_token" {
						res = "rtp"
						table, write = "rt_plain", fmt.Sprintf(`INSERT INTO rt_plain VALUES (%d, 'A')`, id)
					}
					_, err := sqlfuncs.Revoke(ctx, f.b.db.Pool, res)
					require.NoError(t, err)
					t1 := acquireWhenFree(t, ctx, f.ac, res, "A", time.Hour)

					_, err = f.ac.Exec(ctx, `BEGIN ISOLATION LEVEL `+isoSQL(iso))
					require.NoError(t, err)
					defer func() { _, _ = f.ac.Exec(context.WithoutCancel(ctx), `ROLLBACK`) }()
					_, err = f.ac.Exec(ctx, `SELECT 1`)
					require.NoError(t, err)
					t2, err := revokeWithin(ctx, f.b.db.Pool, res, "2s")
					require.NoError(t, err)

					wrapper := map[string]string{"check": "pg_temp.ro_check", "use_token": "pg_temp.ro_use"}[fn]
					var cerr error
					if how == "function with SET" {
						_, cerr = f.ac.Exec(ctx, `SELECT `+wrapper+`($1, $2)`, res, t1)
					} else {
						for _, s := range []string{`SAVEPOINT s`, `SET LOCAL transaction_read_only = on`, fmt.Sprintf(`SELECT fence.%s('%s', %d)`, fn, res, t1), `RELEASE SAVEPOINT s`} {
							if _, cerr = f.ac.Exec(ctx, s); cerr != nil {
								break
							}
						}
					}
					if cerr != nil {
						t.Logf("refused: %s", rt8bCode(cerr))
						return
					}
					var ro string
					require.NoError(t, f.ac.QueryRow(ctx, `SHOW transaction_read_only`).Scan(&ro))
					_, werr := f.ac.Exec(ctx, write)
					if werr != nil {
						if fn == "check" {
							t.Errorf("the unprotected write failed: %s (transaction_read_only=%s)", rt8bCode(werr), ro)
							return
						}
						t.Logf("fence.use_token passed (stale) but the guard refused the write: %s", rt8bCode(werr))
						return
					}
					_, comErr := f.ac.Exec(ctx, `COMMIT`)
					if comErr == nil && f.committed(t, table, id) {
						t.Errorf("BYPASS: (%s) fence.%s(%q, %d) passed read-only (%s), after the grant of token %d had returned; the transaction was read-write again (transaction_read_only=%s) and committed a write to %s",
							iso, fn, res, t1, how, t2, ro, table)
					}
				})
			}
		}
	}
}

// TestRedteam8bGateSurvivesUnlockCalls: after a guarded write under READ
// COMMITTED (the gate is the whole hold), the writer calls every unlock
// function it may: pg_advisory_unlock_shared of the gate's key (also
// repeated), pg_advisory_unlock_all, in the transaction, in a savepoint it
// releases and one it rolls back. The grant must stay busy (FN004) until the
// writer ends.
func TestRedteam8bGateSurvivesUnlockCalls(t *testing.T) {
	t.Parallel()
	f := rt8bSetup(t, "rt8bunl")
	ctx := f.b.ctx
	var key int64
	id := 0
	for _, form := range []string{"cols", "plain", "rows"} {
		for _, how := range []string{"in the transaction", "in a released savepoint", "in a rolled-back savepoint"} {
			id++
			t.Run(form+"/"+how, func(t *testing.T) {
				res := rt8bResource(form, id)
				require.NoError(t, f.b.db.Pool.QueryRow(ctx, `SELECT fence._gate_key($1)`, res).Scan(&key))
				_, err := sqlfuncs.Revoke(ctx, f.b.db.Pool, res)
				require.NoError(t, err)
				t1 := acquireWhenFree(t, ctx, f.ac, res, "A", time.Hour)

				_, err = f.ac.Exec(ctx, `BEGIN`)
				require.NoError(t, err)
				defer func() { _, _ = f.ac.Exec(context.WithoutCancel(ctx), `ROLLBACK`) }()
				_, err = f.ac.Exec(ctx, `SELECT set_config('fence.tokens', $1, true)`, fmt.Sprintf(`{"%s": %d}`, res, t1))
				require.NoError(t, err)
				_, err = f.ac.Exec(ctx, rt8bInsert(form, id, t1, `(SELECT 1) x`))
				require.NoError(t, err, "the write under the latest token")
				unlock := fmt.Sprintf(`SELECT pg_advisory_unlock_shared(%[1]d), pg_advisory_unlock_shared(%[1]d), pg_advisory_unlock(%[1]d), pg_advisory_unlock_all()`, key)
				steps := []string{unlock}
				switch how {
				case "in a released savepoint":
					steps = []string{`SAVEPOINT s`, unlock, `RELEASE SAVEPOINT s`}
				case "in a rolled-back savepoint":
					steps = []string{`SAVEPOINT s`, unlock, `ROLLBACK TO SAVEPOINT s`}
				}
				for _, s := range steps {
					_, err = f.ac.Exec(ctx, s)
					require.NoError(t, err, s)
				}
				t2, revErr := revokeWithin(ctx, f.b.db.Pool, res, "300ms")
				_, comErr := f.ac.Exec(ctx, `COMMIT`)
				if revErr == nil && comErr == nil && f.committed(t, "rt_"+form, id) {
					t.Errorf("BYPASS: (%s) the grant of token %d returned while A's write under token %d was open; A then committed", form, t2, t1)
					return
				}
				if revErr != nil {
					requireOneOf(t, revErr, "FN004")
				}
			})
		}
	}
}

// TestRedteam8bCursorsAcrossSubtransactions: writes made while a cursor
// runs (a function in its select list), with the cursor opened and fetched
// in different subtransactions, a failing FETCH in yet another, WITH HOLD
// cursors, and PL/pgSQL FOR loops whose body fails inside an exception
// block. In each case the rows that stay in the transaction were written
// under t1 while it was the latest; the grant must stay busy (FN004) until
// the writer ends.
func TestRedteam8bCursorsAcrossSubtransactions(t *testing.T) {
	t.Parallel()
	f := rt8bSetup(t, "rt8bcur")
	ctx := f.b.ctx
	_, err := f.ac.Exec(ctx, `CREATE FUNCTION pg_temp.w(form text, i int, base int, res text, t bigint) RETURNS int
LANGUAGE plpgsql AS $$
BEGIN
    IF i = 3 THEN
        RAISE EXCEPTION 'the third row fails';
    END IF;
    IF form = 'cols' THEN
        INSERT INTO public.rt_cols VALUES (base * 10 + i, t, 'A');
    ELSIF form = 'plain' THEN
        PERFORM fence.use_token(res, t);
        INSERT INTO public.rt_plain VALUES (base * 10 + i, 'A');
    ELSE
        INSERT INTO public.rt_rows VALUES (base * 10 + i, base, t, 'A');
    END IF;
    RETURN i;
END
$$`)
	require.NoError(t, err)

	scenarios := []struct {
		name  string
		steps func(call string) []string // each must succeed, except those marked by a leading '!'
	}{
		{"opened in a released savepoint, fetched in another, failing FETCH in a third", func(call string) []string {
			return []string{`SAVEPOINT a`, `DECLARE c NO SCROLL CURSOR FOR SELECT ` + call + ` FROM generate_series(1, 3) i`, `RELEASE SAVEPOINT a`,
				`SAVEPOINT b`, `FETCH 1 FROM c`, `RELEASE SAVEPOINT b`,
				`SAVEPOINT c1`, `FETCH 1 FROM c`, `RELEASE SAVEPOINT c1`,
				`SAVEPOINT d`, `!FETCH 1 FROM c`, `ROLLBACK TO SAVEPOINT d`}
		}},
		{"fetched inside nested savepoints, the inner failing FETCH rolled back, the outer released", func(call string) []string {
			return []string{`DECLARE c NO SCROLL CURSOR FOR SELECT ` + call + ` FROM generate_series(1, 3) i`,
				`SAVEPOINT a`, `FETCH 2 FROM c`, `SAVEPOINT b`, `!FETCH 1 FROM c`, `ROLLBACK TO SAVEPOINT b`, `RELEASE SAVEPOINT a`}
		}},
		{"two cursors, the second failing closes nothing of the first", func(call string) []string {
			return []string{`DECLARE c NO SCROLL CURSOR FOR SELECT ` + call + ` FROM generate_series(1, 3) i`,
				`DECLARE c2 NO SCROLL CURSOR FOR SELECT ` + call + ` FROM generate_series(3, 3) i`,
				`FETCH 1 FROM c`, `SAVEPOINT b`, `!FETCH 1 FROM c2`, `ROLLBACK TO SAVEPOINT b`,
				`SAVEPOINT e`, `!FETCH 2 FROM c`, `ROLLBACK TO SAVEPOINT e`, `CLOSE c`}
		}},
		{"WITH HOLD cursor fetched, then failing FETCH in a savepoint", func(call string) []string {
			return []string{`DECLARE c NO SCROLL CURSOR WITH HOLD FOR SELECT ` + call + ` FROM generate_series(1, 3) i`,
				`FETCH 1 FROM c`, `SAVEPOINT b`, `!FETCH 2 FROM c`, `ROLLBACK TO SAVEPOINT b`}
		}},
		{"PL/pgSQL FOR loop over the writing query, failing in an exception block", func(call string) []string {
			return []string{`DO $$
DECLARE
    x int;
BEGIN
    BEGIN
        FOR x IN SELECT ` + call + ` FROM generate_series(1, 3) i LOOP
            NULL;
        END LOOP;
    EXCEPTION WHEN others THEN
        NULL;
    END;
    FOR x IN SELECT ` + call + ` FROM generate_series(1, 2) i LOOP
        NULL;
    END LOOP;
END
$$`}
		}},
		{"PL/pgSQL cursor opened in a block, fetched outside, failing FETCH in another block", func(call string) []string {
			return []string{`DO $$
DECLARE
    c refcursor := 'cc';
    x int;
BEGIN
    BEGIN
        OPEN c FOR SELECT ` + call + ` FROM generate_series(1, 3) i;
    EXCEPTION WHEN others THEN
        NULL;
    END;
    FETCH c INTO x;
    BEGIN
        FETCH c INTO x;
        FETCH c INTO x;
    EXCEPTION WHEN others THEN
        NULL;
    END;
END
$$`}
		}},
	}

	base := 0
	for _, form := range []string{"cols", "plain", "rows"} {
		for _, sc := range scenarios {
			for _, iso := range isoLevels {
				base++
				t.Run(fmt.Sprintf("%s/%s/%s", form, sc.name, iso), func(t *testing.T) {
					res := rt8bResource(form, base)
					_, err := sqlfuncs.Revoke(ctx, f.b.db.Pool, res)
					require.NoError(t, err)
					t1 := acquireWhenFree(t, ctx, f.ac, res, "A", time.Hour)
					call := fmt.Sprintf(`pg_temp.w('%s', i, %d, '%s', %d)`, form, base, res, t1)

					_, err = f.ac.Exec(ctx, `BEGIN ISOLATION LEVEL `+isoSQL(iso))
					require.NoError(t, err)
					defer func() {
						_, _ = f.ac.Exec(context.WithoutCancel(ctx), `ROLLBACK`)
						_, _ = f.ac.Exec(context.WithoutCancel(ctx), `CLOSE ALL`)
					}()
					for _, s := range sc.steps(call) {
						mustFail := s[0] == '!'
						if mustFail {
							s = s[1:]
						}
						_, err := f.ac.Exec(ctx, s)
						if mustFail {
							require.Error(t, err, s)
						} else {
							require.NoError(t, err, s)
						}
					}
					var rows int
					require.NoError(t, f.ac.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM rt_%s WHERE id / 10 = %d`, form, base)).Scan(&rows))
					require.Positive(t, rows, "rows under t1 stay in the transaction")

					t2, revErr := revokeWithin(ctx, f.b.db.Pool, res, "300ms")
					_, comErr := f.ac.Exec(ctx, `COMMIT`)
					var stored int
					require.NoError(t, f.b.db.Pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM rt_%s WHERE id / 10 = %d`, form, base)).Scan(&stored))
					if revErr == nil && comErr == nil && stored > 0 {
						t.Errorf("BYPASS: (%s) the grant of token %d returned while A's transaction, holding %d rows under token %d, was open; A then committed %d rows",
							iso, t2, rows, t1, stored)
						return
					}
					if revErr != nil {
						requireOneOf(t, revErr, "FN004")
					}
				})
			}
		}
	}
}

// TestRedteam8bPreparedTransactionKeepsTheGate: a writer that prepares its
// transaction (two-phase commit, in a cluster that allows it) hands its
// locks to the prepared transaction; the grant must stay busy until COMMIT
// PREPARED, and a write under t1 prepared before the grant may commit, but a
// grant that returned first makes the prepared write fail.
func TestRedteam8bPreparedTransactionKeepsTheGate(t *testing.T) {
	t.Parallel()
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{Config: map[string]string{"max_prepared_transactions": "4"}})
	ctx := t.Context()
	owner, err := pgx.Connect(ctx, c.URL())
	require.NoError(t, err)
	t.Cleanup(func() { _ = owner.Close(context.WithoutCancel(ctx)) })
	app := "rt8b2pc"
	_, err = owner.Exec(ctx, `CREATE ROLE rt8b2pc LOGIN`)
	require.NoError(t, err)
	rt8bTables(t, ctx, owner, app)
	ac, err := pgx.Connect(ctx, c.URLAs(app))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ac.Close(context.WithoutCancel(ctx)) })

	id := 0
	for _, form := range []string{"cols", "plain", "rows"} {
		for _, iso := range isoLevels {
			id++
			t.Run(fmt.Sprintf("%s/%s", form, iso), func(t *testing.T) {
				res := rt8bResource(form, id)
				_, err := sqlfuncs.Revoke(ctx, owner, res)
				require.NoError(t, err)
				t1 := acquireWhenFree(t, ctx, ac, res, "A", time.Hour)
				gid := fmt.Sprintf("rt8b_%d", id)
				defer func() { _, _ = owner.Exec(context.WithoutCancel(ctx), `ROLLBACK PREPARED '`+gid+`'`) }()

				_, err = ac.Exec(ctx, `BEGIN ISOLATION LEVEL `+isoSQL(iso))
				require.NoError(t, err)
				_, err = ac.Exec(ctx, `SELECT set_config('fence.tokens', $1, true)`, fmt.Sprintf(`{"%s": %d}`, res, t1))
				require.NoError(t, err)
				_, err = ac.Exec(ctx, rt8bInsert(form, id, t1, `(SELECT 1) x`))
				require.NoError(t, err)
				_, err = ac.Exec(ctx, `PREPARE TRANSACTION '`+gid+`'`)
				require.NoError(t, err)

				t2, revErr := revokeWithin(ctx, owner, res, "300ms")
				_, comErr := ac.Exec(ctx, `COMMIT PREPARED '`+gid+`'`)
				var n int
				require.NoError(t, owner.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM rt_%s WHERE id = %d`, form, id)).Scan(&n))
				if revErr == nil && comErr == nil && n > 0 {
					t.Errorf("BYPASS: (%s) the grant of token %d returned while A's prepared transaction, holding a write under token %d, was open; COMMIT PREPARED then committed it", iso, t2, t1)
					return
				}
				if revErr != nil {
					requireOneOf(t, revErr, "FN004")
				}
			})
		}
	}
}
