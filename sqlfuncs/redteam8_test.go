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

// The tests in this file come from a red-team review of migration 008's
// fast paths (fence._guard_source, fence.check, fence.use_token). Each one
// passes while the kit refuses; a bypass fails it with a message that starts
// with "BYPASS:".

// isoSQL spells an isolation level for BEGIN.
func isoSQL(iso pgx.TxIsoLevel) string {
	return strings.ToUpper(string(iso))
}

// revokeWithin revokes resource as db's role with fence.grant_wait set to
// wait: the new token, or the grant's error (FN004 when it stayed busy).
func revokeWithin(ctx context.Context, db interface {
	BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error)
}, resource, wait string) (int64, error) {
	tx, err := db.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `SELECT set_config('fence.grant_wait', $1, true)`, wait); err != nil {
		return 0, err
	}
	var tok int64
	if err := tx.QueryRow(ctx, `SELECT fence.revoke($1)`, resource).Scan(&tok); err != nil {
		return 0, err
	}
	return tok, tx.Commit(ctx)
}

// sqlState is err's SQLSTATE, or "" when err is nil or not PostgreSQL's.
func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// TestRedteam8FailedCursorFetchDropsTheGate: the guards' fast path holds
// nothing but the resource's gate, a transaction-level advisory lock in
// share mode (under READ COMMITTED for every form; since 008 also under
// REPEATABLE READ and SERIALIZABLE, where fence.check used to lock the
// lease row). PostgreSQL files a lock under the resource owner that is
// current when it is taken; a write made while a cursor runs (a function in
// its select list) takes the gate under the cursor's portal. When a later
// FETCH of that cursor fails inside a savepoint (or a PL/pgSQL exception
// block), the portal is marked failed and its resource owner is released
// with the subtransaction: the gate goes, the rows written by the earlier
// FETCH stay, since they belong to the outer transaction. A grant then
// takes the gate at once and returns a new token while the writer's
// transaction, holding a write under the old token, is still open; the
// writer then commits. SPEC guarantee 3: once T2 has been granted, no write
// under T1 commits.
func TestRedteam8FailedCursorFetchDropsTheGate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.ctx
	app := pgtest.NewRole(t, "rtcur")
	require.NoError(t, sqlfuncs.GrantUsage(ctx, b.db.Pool, app, false))
	for _, s := range []string{
		`CREATE TABLE rt_cols (id int PRIMARY KEY, tok bigint, val text)`,
		`CREATE TABLE rt_plain (id int PRIMARY KEY, val text)`,
		`CREATE TABLE rt_rows (id int PRIMARY KEY, job int NOT NULL, tok bigint, val text)`,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON rt_cols, rt_plain, rt_rows TO ` + pgx.Identifier{app}.Sanitize(),
	} {
		b.exec(t, s)
	}
	require.NoError(t, sqlfuncs.Protect(ctx, b.db.Pool, "rt_cols", "rtc", "tok"))
	require.NoError(t, sqlfuncs.Protect(ctx, b.db.Pool, "rt_plain", "rtp", ""))
	require.NoError(t, sqlfuncs.ProtectRows(ctx, b.db.Pool, "rt_rows", "job", "rtj:", "tok"))

	ac := roleConn(t, b, app)
	// TEMP is PUBLIC's: the role needs CREATE nowhere for this.
	_, err := ac.Exec(ctx, `CREATE FUNCTION pg_temp.w(form text, i int, base int, res text, t bigint) RETURNS int
LANGUAGE plpgsql AS $$
BEGIN
    IF i = 2 THEN
        RAISE EXCEPTION 'the second row fails';
    END IF;
    IF form = 'cols' THEN
        INSERT INTO public.rt_cols VALUES (base, t, 'A');
    ELSIF form = 'plain' THEN
        PERFORM fence.use_token(res, t);
        INSERT INTO public.rt_plain VALUES (base, 'A');
    ELSE
        INSERT INTO public.rt_rows VALUES (base, base, t, 'A');
    END IF;
    RETURN i;
END
$$`)
	require.NoError(t, err)

	base := 0
	for _, form := range []string{"cols", "plain", "rows"} {
		for _, how := range []string{"savepoint", "DO block"} {
			for _, iso := range isoLevels {
				base++
				t.Run(fmt.Sprintf("%s/%s/%s", form, how, iso), func(t *testing.T) {
					res, table := map[string]string{"cols": "rtc", "plain": "rtp"}[form], "rt_"+form
					if form == "rows" {
						res = fmt.Sprintf("rtj:%d", base)
					}
					_, err := sqlfuncs.Revoke(ctx, b.db.Pool, res)
					require.NoError(t, err)
					t1 := acquireWhenFree(t, ctx, ac, res, "A", time.Hour)
					if iso != pgx.ReadCommitted {
						// The grant leaves its own lock in the new version's
						// xmax, which sends snapshot writers to the slow path
						// until a vacuum clears it (autovacuum does, in time).
						b.exec(t, `VACUUM (FREEZE) fence.lease`)
					}
					call := fmt.Sprintf(`pg_temp.w('%s', i, %d, '%s', %d)`, form, base, res, t1)

					_, err = ac.Exec(ctx, `BEGIN ISOLATION LEVEL `+isoSQL(iso))
					require.NoError(t, err)
					defer func() { _, _ = ac.Exec(context.WithoutCancel(ctx), `ROLLBACK`) }()
					if how == "savepoint" {
						_, err = ac.Exec(ctx, `DECLARE c NO SCROLL CURSOR FOR SELECT `+call+` FROM generate_series(1, 2) i`)
						require.NoError(t, err)
						_, err = ac.Exec(ctx, `FETCH 1 FROM c`)
						require.NoError(t, err, "the first row is written under the latest token")
						_, err = ac.Exec(ctx, `SAVEPOINT s`)
						require.NoError(t, err)
						_, err = ac.Exec(ctx, `FETCH 1 FROM c`)
						require.Error(t, err, "the second FETCH fails")
						_, err = ac.Exec(ctx, `ROLLBACK TO SAVEPOINT s`)
						require.NoError(t, err)
					} else {
						_, err = ac.Exec(ctx, `DO $$
DECLARE
    c refcursor;
    x int;
BEGIN
    OPEN c FOR SELECT `+call+` FROM generate_series(1, 2) i;
    FETCH c INTO x;
    BEGIN
        FETCH c INTO x;
    EXCEPTION WHEN others THEN
        NULL;
    END;
END
$$`)
						require.NoError(t, err)
					}
					var gates int
					require.NoError(t, ac.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory'`).Scan(&gates))

					t2, revErr := revokeWithin(ctx, b.db.Pool, res, "300ms")
					_, commitErr := ac.Exec(ctx, `COMMIT`)
					var stored int64
					found := b.db.Pool.QueryRow(ctx, fmt.Sprintf(`SELECT tok FROM %s WHERE id = $1`, table), base).Scan(&stored)
					if form == "plain" {
						found = b.db.Pool.QueryRow(ctx, `SELECT $2::bigint FROM rt_plain WHERE id = $1`, base, t1).Scan(&stored)
					}
					if revErr == nil && commitErr == nil && found == nil {
						t.Errorf("BYPASS: (%s) the grant of token %d returned while A's transaction, holding a write under token %d, was open (A held %d advisory locks after the failed FETCH); A then committed, and the row carries %d",
							iso, t2, t1, gates, stored)
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

// TestRedteam8RowMovedIntoAProtectedPartition: a table protected with a
// token column and attached later as a partition stays guarded for writes
// routed through the parent (TestProtectedTableAttachedLaterStaysGuarded).
// But an UPDATE through the parent that moves a row into the protected
// partition from another one is an INSERT there (PostgreSQL fires the
// destination's BEFORE INSERT triggers), and the guard's INSERT path takes
// the token from the new row, which is the token the row already carried.
// The writer assigned no token column and called no fence.use_token. SPEC
// guarantee 2: a write that presents none fails with FN002 whatever the row
// already carries. Here B (latest token t2) wrote the row into the
// unprotected partition with t2; A, whose t1 is stale, moves it into the
// protected one: by UPDATE, by MERGE, and by a foreign key's ON UPDATE
// CASCADE on the partition key.
func TestRedteam8RowMovedIntoAProtectedPartition(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.ctx
	ver := serverVersion(t, ctx, b.db.Pool)
	app := pgtest.NewRole(t, "rtmove")
	require.NoError(t, sqlfuncs.GrantUsage(ctx, b.db.Pool, app, false))
	b.exec(t, `CREATE TABLE rt_hot (id int NOT NULL, k int NOT NULL, tok bigint, val text)`)
	require.NoError(t, sqlfuncs.Protect(ctx, b.db.Pool, "rt_hot", "rthot", "tok"))
	for _, s := range []string{
		`CREATE TABLE rt_keys (k int PRIMARY KEY)`,
		`INSERT INTO rt_keys VALUES (5), (150)`,
		`CREATE TABLE rt_items (id int NOT NULL, k int NOT NULL REFERENCES rt_keys ON UPDATE CASCADE, tok bigint, val text) PARTITION BY RANGE (k)`,
		`ALTER TABLE rt_items ATTACH PARTITION rt_hot FOR VALUES FROM (0) TO (100)`,
		`CREATE TABLE rt_cold PARTITION OF rt_items FOR VALUES FROM (100) TO (200)`,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON rt_items, rt_hot, rt_cold, rt_keys TO ` + pgx.Identifier{app}.Sanitize(),
	} {
		b.exec(t, s)
	}
	ac := roleConn(t, b, app)
	t1 := acquireWhenFree(t, ctx, ac, "rthot", "A", time.Hour)
	_, err := sqlfuncs.Revoke(ctx, b.db.Pool, "rthot")
	require.NoError(t, err)
	t2 := acquireWhenFree(t, ctx, b.db.Pool, "rthot", "B", time.Hour)
	b.exec(t, `INSERT INTO rt_cold VALUES (1, 150, $1, 'B')`, t2)

	// The control: A's UPDATE of the protected partition's rows presents
	// nothing and fails.
	require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		if err := sqlfuncs.UseToken(ctx, tx, "rthot", t2); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO rt_items VALUES (2, 5, NULL, 'B')`)
		return err
	}))
	requireOneOf(t, attempt(ctx, ac, pgx.ReadCommitted, nil, `UPDATE rt_items SET val = 'A' WHERE id = 2`), "FN002")

	const read = `SELECT coalesce(string_agg(format('%s:%s:%s:%s', id, k, tok, val), ',' ORDER BY id), '') FROM rt_hot`
	stale := fmt.Sprintf(`SELECT set_config('fence.tokens', '{"rthot": %d}', true)`, t1)
	for _, tc := range []struct {
		name, sql string
		pre       []string
		min       int
	}{
		{name: "UPDATE of the partition key, no token", sql: `UPDATE rt_items SET k = 5, val = 'A' WHERE id = 1`},
		{name: "UPDATE of the partition key, A's stale token registered", sql: `UPDATE rt_items SET k = 5, val = 'A' WHERE id = 1`, pre: []string{stale}},
		{name: "MERGE that moves the row, no token", sql: `MERGE INTO rt_items t USING (VALUES (1)) s(id) ON t.id = s.id WHEN MATCHED THEN UPDATE SET k = 5, val = 'A'`, min: 150000},
		{name: "ON UPDATE CASCADE of the partition key, no token", sql: `UPDATE rt_keys SET k = 6 WHERE k = 150`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if ver < tc.min {
				t.Skipf("needs server version %d", tc.min)
			}
			for _, iso := range isoLevels {
				seen, err := attemptRolledBack(ctx, ac, iso, tc.pre, tc.sql, read)
				if err == nil {
					t.Errorf("BYPASS: (%s) A (token %d stale, latest %d) moved B's row into the protected partition without presenting a token; the partition now holds %s", iso, t1, t2, seen)
					continue
				}
				requireOneOf(t, err, "FN001|FN002")
			}
		})
	}
}

// TestRedteam8GuardOperatorFromTheCallersSearchPath: the table-wide guard
// reads fence.tokens with NULLIF(current_setting(...), ''), new in 008.
// NULLIF compares with the operator "=" that the caller's search_path
// finds: a schema named before pg_catalog wins. The guard runs with the
// writer's search_path and as whoever current_user is, and a foreign-key
// action runs it as the table's owner. So a role that owns a schema (any
// application role usually does; on PostgreSQL 13 and 14 schema public is
// enough) puts an operator = (text, text) there, sets its search_path and
// fence.tokens, and deletes a parent row: the cascade into the owner's
// protected child calls the role's function as the owner. SPEC guarantee
// 6: code that runs under the caller's search_path (guards) qualifies every
// operator; a role with usage cannot bypass a guard on a table it does not
// own. Here the function, run as the owner, disables the guards of another
// of the owner's protected tables, and the role writes that table without
// any token. Without usage the write itself is refused (42501), but the
// function has already run as the owner (a sequence, which no rollback
// undoes, shows it).
func TestRedteam8GuardOperatorFromTheCallersSearchPath(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.ctx
	owner, app, nouse := pgtest.NewRole(t, "rtown"), pgtest.NewRole(t, "rtop"), pgtest.NewRole(t, "rtnouse")
	ownerID, appID, nouseID := pgx.Identifier{owner}.Sanitize(), pgx.Identifier{app}.Sanitize(), pgx.Identifier{nouse}.Sanitize()
	require.NoError(t, sqlfuncs.GrantUsage(ctx, b.db.Pool, owner, false))
	require.NoError(t, sqlfuncs.GrantUsage(ctx, b.db.Pool, app, false))
	for _, s := range []string{
		`CREATE TABLE rt_par (id int PRIMARY KEY)`,
		`CREATE TABLE rt_kid (id int PRIMARY KEY, pid int REFERENCES rt_par ON DELETE CASCADE, val text)`,
		`CREATE TABLE rt_other (id int PRIMARY KEY, tok bigint, val text)`,
		`ALTER TABLE rt_par OWNER TO ` + ownerID,
		`ALTER TABLE rt_kid OWNER TO ` + ownerID,
		`ALTER TABLE rt_other OWNER TO ` + ownerID,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON rt_par, rt_kid, rt_other TO ` + appID + `, ` + nouseID,
		// the application roles' own schemas
		`CREATE SCHEMA rt_app AUTHORIZATION ` + appID,
		`CREATE SCHEMA rt_nouse AUTHORIZATION ` + nouseID,
	} {
		b.exec(t, s)
	}
	oc := roleConn(t, b, owner)
	require.NoError(t, sqlfuncs.Protect(ctx, oc, "rt_kid", "rtkids", ""))
	require.NoError(t, sqlfuncs.Protect(ctx, oc, "rt_other", "rtother", "tok"))
	tk := acquireWhenFree(t, ctx, oc, "rtkids", "owner", time.Hour)
	require.NoError(t, pgx.BeginFunc(ctx, oc, func(tx pgx.Tx) error {
		if err := sqlfuncs.UseToken(ctx, tx, "rtkids", tk); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO rt_par VALUES (1), (2); INSERT INTO rt_kid VALUES (1, 1, 'owner'), (2, 2, 'owner')`)
		return err
	}))

	// The operator: as anyone but the session's own role it records who ran
	// it and disables the guards of rt_other.
	plant := func(c *pgx.Conn, schema string) {
		for _, s := range []string{
			`CREATE TABLE ` + schema + `.seen (who name)`,
			`CREATE SEQUENCE ` + schema + `.ran`,
			`GRANT INSERT ON ` + schema + `.seen TO PUBLIC`,
			`GRANT USAGE, UPDATE ON SEQUENCE ` + schema + `.ran TO PUBLIC`,
			`CREATE FUNCTION ` + schema + `.eq(a text, b text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF CURRENT_USER OPERATOR(pg_catalog.<>) SESSION_USER THEN
        INSERT INTO ` + schema + `.seen VALUES (CURRENT_USER);
        PERFORM pg_catalog.nextval('` + schema + `.ran');
        BEGIN
            EXECUTE 'ALTER TABLE public.rt_other DISABLE TRIGGER USER';
        EXCEPTION WHEN others THEN
            NULL;
        END;
    END IF;
    RETURN a OPERATOR(pg_catalog.=) b;
END
$$`,
			`CREATE OPERATOR ` + schema + `.= (LEFTARG = text, RIGHTARG = text, FUNCTION = ` + schema + `.eq)`,
			`GRANT USAGE ON SCHEMA ` + schema + ` TO PUBLIC`,
		} {
			_, err := c.Exec(ctx, s)
			require.NoError(t, err, s)
		}
	}

	t.Run("with usage", func(t *testing.T) {
		ac := roleConn(t, b, app)
		plant(ac, "rt_app")
		inTx(t, ctx, ac, pgx.ReadCommitted, func(tx pgx.Tx) {
			_, err := tx.Exec(ctx, `SET LOCAL search_path = rt_app, pg_catalog, public`)
			require.NoError(t, err)
			// the role's own, valid token for the parent's cascade (read from
			// fence.lease, as usage allows)
			_, err = tx.Exec(ctx, `SELECT fence.use_token('rtkids', (SELECT token FROM fence.lease WHERE resource = 'rtkids'))`)
			require.NoError(t, err)
			_, err = tx.Exec(ctx, `DELETE FROM public.rt_par WHERE id = 1`)
			require.NoError(t, err, "the cascade, with the latest token registered")
			var who string
			require.NoError(t, tx.QueryRow(ctx, `SELECT coalesce(string_agg(DISTINCT who::text, ','), '') FROM rt_app.seen`).Scan(&who))
			var enabled string
			require.NoError(t, tx.QueryRow(ctx, `SELECT string_agg(DISTINCT tgenabled::text, ',') FROM pg_catalog.pg_trigger WHERE tgrelid = 'public.rt_other'::regclass`).Scan(&enabled))
			_, wErr := tx.Exec(ctx, `RESET search_path; INSERT INTO rt_other VALUES (1, NULL, 'no token')`)
			if who != "" {
				t.Errorf("BYPASS: the guard of %s's table rt_kid called the application role's operator as %s (guards now %q); the role's tokenless INSERT into rt_other then got %v",
					owner, who, enabled, wErr)
				return
			}
			requireOneOf(t, wErr, "FN002")
		})
	})

	t.Run("without usage", func(t *testing.T) {
		nc := roleConn(t, b, nouse)
		plant(nc, "rt_nouse")
		err := attempt(ctx, nc, pgx.ReadCommitted, []string{
			`SET LOCAL search_path = rt_nouse, pg_catalog, public`,
			`SELECT set_config('fence.tokens', '{}', true)`,
		}, `DELETE FROM public.rt_par WHERE id = 2`)
		var ran bool
		require.NoError(t, nc.QueryRow(ctx, `SELECT is_called FROM rt_nouse.ran`).Scan(&ran))
		if ran {
			t.Errorf("BYPASS: a role without usage made the guard of %s's table rt_kid run its operator as %s (the write itself: %v)", owner, owner, err)
			return
		}
		requireOneOf(t, err, "42501")
	})
}
