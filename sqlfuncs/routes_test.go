package sqlfuncs_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// The tests in this file try the routes by which PostgreSQL writes a
// protected table with another role's rights than the session's: cascaded
// foreign-key actions (they run as the owner of the referencing table),
// SECURITY DEFINER functions and triggers of the table's owner, views
// (their tables are accessed with the view owner's rights) and rules. SPEC
// guarantee 6: a role without the kit's usage cannot write to a protected
// table at all, by whatever route the write arrives and whatever settings it
// sets; a role with usage gets no more than it could do by writing itself.

// routesFix: tables owned by role owner (which has the kit's usage, as every
// role that writes a protected table needs): a parent "par" (id, tok) and,
// protected under resource "kids", a child with a token column (kc) and one
// without (kp), both referencing the parent; the token column of kc is part
// of its foreign key (ON UPDATE CASCADE assigns it). Rows 1 and 3 carry
// the latest token t; row 2 was written under t0, which a revoke made
// stale. Role n has every table privilege on the parent but not the kit's
// usage; role u has both.
type routesFix struct {
	b          *bundle
	t0, t      int64
	owner      string
	n, u       string
	nPool      *pgx.Conn
	uConn      *pgx.Conn
	nID, uID   string
	ownerIdent string
}

func routesStory(t *testing.T) *routesFix {
	t.Helper()
	b := setup(t)
	f := &routesFix{b: b}
	f.owner = pgtest.NewRole(t, "owner")
	f.n, f.u = pgtest.NewRole(t, "nousage"), pgtest.NewRole(t, "usage")
	f.ownerIdent, f.nID, f.uID = pgx.Identifier{f.owner}.Sanitize(), pgx.Identifier{f.n}.Sanitize(), pgx.Identifier{f.u}.Sanitize()
	require.NoError(t, sqlfuncs.GrantUsage(b.ctx, b.db.Pool, f.owner, false))
	require.NoError(t, sqlfuncs.GrantUsage(b.ctx, b.db.Pool, f.u, false))
	f.t0 = acquireWhenFree(t, b.ctx, b.db.Pool, "kids", "A", time.Hour)
	for _, s := range []string{
		`CREATE TABLE par (id int PRIMARY KEY, tok bigint, UNIQUE (id, tok))`,
		`CREATE TABLE kc (id int PRIMARY KEY, pid int, tok bigint,
		   FOREIGN KEY (pid, tok) REFERENCES par (id, tok) ON UPDATE CASCADE ON DELETE CASCADE)`,
		`CREATE TABLE kp (id int PRIMARY KEY, pid int REFERENCES par ON UPDATE CASCADE ON DELETE CASCADE, val text)`,
		`ALTER TABLE par OWNER TO ` + f.ownerIdent,
		`ALTER TABLE kc OWNER TO ` + f.ownerIdent,
		`ALTER TABLE kp OWNER TO ` + f.ownerIdent,
		`GRANT ALL ON par TO ` + f.nID + `, ` + f.uID,
		`GRANT TRUNCATE ON kc, kp TO ` + f.nID,
		`GRANT CREATE ON SCHEMA public TO ` + f.ownerIdent,
	} {
		b.exec(t, s)
	}
	oc := roleConn(t, b, f.owner)
	require.NoError(t, sqlfuncs.Protect(b.ctx, oc, "kc", "kids", "tok"))
	require.NoError(t, sqlfuncs.Protect(b.ctx, oc, "kp", "kids", ""))
	write := func(tok int64, ids ...int) {
		require.NoError(t, pgx.BeginFunc(b.ctx, oc, func(tx pgx.Tx) error {
			require.NoError(t, sqlfuncs.UseToken(b.ctx, tx, "kids", tok))
			for _, id := range ids {
				if _, err := tx.Exec(b.ctx, `INSERT INTO par VALUES ($1, $2)`, id, tok); err != nil {
					return err
				}
				if _, err := tx.Exec(b.ctx, `INSERT INTO kc VALUES ($1, $1, $2)`, id, tok); err != nil {
					return err
				}
				if _, err := tx.Exec(b.ctx, `INSERT INTO kp VALUES ($1, $1, 'B')`, id); err != nil {
					return err
				}
			}
			return nil
		}))
	}
	write(f.t0, 2)
	_, err := sqlfuncs.Revoke(b.ctx, b.db.Pool, "kids")
	require.NoError(t, err)
	f.t = acquireWhenFree(t, b.ctx, b.db.Pool, "kids", "B", time.Hour)
	write(f.t, 1, 3)
	f.nPool, f.uConn = roleConn(t, b, f.n), roleConn(t, b, f.u)
	return f
}

// kids is every child row, for the before/after comparison.
func (f *routesFix) kids(t *testing.T) string {
	t.Helper()
	var s string
	require.NoError(t, f.b.db.Pool.QueryRow(f.b.ctx, `SELECT concat_ws(' | ',
		(SELECT string_agg(format('%s:%s:%s', id, pid, tok), ',' ORDER BY id) FROM kc),
		(SELECT string_agg(format('%s:%s:%s', id, pid, val), ',' ORDER BY id) FROM kp))`).Scan(&s))
	return s
}

// TestRoleWithoutUsageCannotWriteThroughACascade (issue 19, item 1): the
// foreign-key actions that N's writes of the parent fire run as the owner of
// the children, who has the kit's usage, so the guard's own reads succeed;
// the token came from fence.tokens, which N set by hand to the latest token
// (its first refused attempt tells it), or from the cascade itself, which
// assigns the token column when that column is part of the foreign key. On
// 006 both committed. Now the guard asks whether the role the session acts
// as (SET ROLE, else the session user) has the kit's usage: 42501.
func TestRoleWithoutUsageCannotWriteThroughACascade(t *testing.T) {
	t.Parallel()
	f := routesStory(t)
	ctx := f.b.ctx
	before := f.kids(t)
	forged := fmt.Sprintf(`SELECT set_config('fence.tokens', '{"kids": %d}', true)`, f.t)
	for _, tc := range []struct{ name, pre, sql string }{
		{"ON DELETE CASCADE, fence.tokens set by hand", forged, `DELETE FROM par WHERE id = 1`},
		{"ON UPDATE CASCADE of the key, fence.tokens set by hand", forged, `UPDATE par SET id = 10 WHERE id = 1`},
		{"ON UPDATE CASCADE assigns the latest token to the token column", "", fmt.Sprintf(`UPDATE par SET tok = %d WHERE id = 2`, f.t)},
		{"ON UPDATE CASCADE assigns the token column, fence.tokens set by hand", forged, fmt.Sprintf(`UPDATE par SET tok = %d WHERE id = 2`, f.t)},
		{"TRUNCATE ... CASCADE, fence.tokens set by hand", forged, `TRUNCATE par CASCADE`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, iso := range isoLevels {
				var pre []string
				if tc.pre != "" {
					pre = []string{tc.pre}
				}
				err := attempt(ctx, f.nPool, iso, pre, tc.sql)
				requireOneOf(t, err, "42501")
			}
			require.Equal(t, before, f.kids(t))
		})
	}

	// SET ROLE to a role without usage, from a session user with usage:
	// the session acts as the role it set.
	t.Run("SET ROLE to a role without usage", func(t *testing.T) {
		other := pgx.Identifier{pgtest.NewRole(t, "nousage2")}.Sanitize()
		f.b.exec(t, `GRANT ALL ON par TO `+other)
		t.Cleanup(func() { f.b.exec(t, `REVOKE ALL ON par FROM `+other) })
		f.b.exec(t, `GRANT `+other+` TO `+f.uID)
		err := attempt(ctx, f.uConn, pgx.ReadCommitted, []string{`SET LOCAL ROLE ` + other, forged}, `DELETE FROM par WHERE id = 1`)
		requireOneOf(t, err, "42501")
		require.Equal(t, before, f.kids(t))
	})

	// A role with usage still fires the cascades it presents a token for,
	// and its SET ROLE from a login role without usage (as PostgREST does)
	// is what counts.
	t.Run("a role with usage presents its token", func(t *testing.T) {
		require.NoError(t, attempt(ctx, f.uConn, pgx.ReadCommitted,
			[]string{fmt.Sprintf(`SELECT fence.use_token('kids', %d)`, f.t)}, `DELETE FROM par WHERE id = 3`))
		err := attempt(ctx, f.uConn, pgx.ReadCommitted, nil, `DELETE FROM par WHERE id = 2`)
		requireOneOf(t, err, "FN002")
		f.b.exec(t, `GRANT `+f.uID+` TO `+f.nID)
		require.NoError(t, attempt(ctx, f.nPool, pgx.ReadCommitted,
			[]string{`SET LOCAL ROLE ` + f.uID, fmt.Sprintf(`SELECT fence.use_token('kids', %d)`, f.t)}, `UPDATE par SET id = 10 WHERE id = 1`))
		require.Equal(t, fmt.Sprintf("1:10:%d,2:2:%d | 1:10:B,2:2:B", f.t, f.t0), f.kids(t))
	})
}

// TestRoleWithoutUsageCannotWriteThroughTheOwnersCode (issue 19, item 1):
// code of the table's owner that runs with the owner's rights (a SECURITY
// DEFINER function, a trigger on a table N may write whose function is
// SECURITY DEFINER) writes the protected table for N. The guard runs as the
// owner; what counts is the role the session acts as. Views and rules
// access tables with their owner's rights but run the guards as N: refused
// as before.
func TestRoleWithoutUsageCannotWriteThroughTheOwnersCode(t *testing.T) {
	t.Parallel()
	f := routesStory(t)
	ctx := f.b.ctx
	oc := roleConn(t, f.b, f.owner)
	for _, s := range []string{
		`CREATE FUNCTION public.owner_update(v text) RETURNS void LANGUAGE sql SECURITY DEFINER SET search_path = public
		   AS $$ UPDATE kp SET val = v WHERE id = 1 $$`,
		fmt.Sprintf(`CREATE FUNCTION public.owner_assign(v text) RETURNS void LANGUAGE sql SECURITY DEFINER SET search_path = public
		   AS $$ UPDATE kc SET tok = %d WHERE id = 1 $$`, f.t),
		`CREATE TABLE inbox (v text)`,
		`CREATE FUNCTION public.inbox_trg() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path = public
		   AS $$ BEGIN UPDATE kp SET val = NEW.v WHERE id = 2; RETURN NEW; END $$`,
		`CREATE TRIGGER inbox_trg AFTER INSERT ON inbox FOR EACH ROW EXECUTE FUNCTION public.inbox_trg()`,
		`CREATE VIEW kp_view AS SELECT * FROM kp`,
		`CREATE TABLE kp_rule_target (id int, val text)`,
		`CREATE RULE kp_rule AS ON INSERT TO kp_rule_target DO INSTEAD UPDATE kp SET val = NEW.val WHERE id = NEW.id`,
	} {
		_, err := oc.Exec(ctx, s)
		require.NoError(t, err, s)
	}
	for _, s := range []string{
		`GRANT EXECUTE ON FUNCTION public.owner_update(text), public.owner_assign(text) TO %[1]s, %[2]s`,
		`GRANT ALL ON inbox, kp_view, kp_rule_target TO %[1]s, %[2]s`,
	} {
		_, err := oc.Exec(ctx, fmt.Sprintf(s, f.nID, f.uID))
		require.NoError(t, err, s)
	}
	before := f.kids(t)
	forged := fmt.Sprintf(`SELECT set_config('fence.tokens', '{"kids": %d}', true)`, f.t)
	for _, tc := range []struct{ name, sql string }{
		{"SECURITY DEFINER function of the owner", `SELECT public.owner_update('N')`},
		{"SECURITY DEFINER function of the owner assigns the token column", `SELECT public.owner_assign('N')`},
		{"SECURITY DEFINER trigger of the owner", `INSERT INTO inbox VALUES ('N')`},
		{"view of the owner", `UPDATE kp_view SET val = 'N' WHERE id = 1`},
		{"rule of the owner", `INSERT INTO kp_rule_target VALUES (1, 'N')`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, pre := range [][]string{nil, {forged}} {
				requireOneOf(t, attempt(ctx, f.nPool, pgx.ReadCommitted, pre, tc.sql), "42501")
			}
			require.Equal(t, before, f.kids(t))
		})
	}
	// The same routes for a role with usage: it presents its token like any
	// writer (use_token, or the function assigns the column).
	use := fmt.Sprintf(`SELECT fence.use_token('kids', %d)`, f.t)
	for _, sql := range []string{`SELECT public.owner_update('U')`, `INSERT INTO inbox VALUES ('U')`, `UPDATE kp_view SET val = 'U' WHERE id = 3`} {
		requireOneOf(t, attempt(ctx, f.uConn, pgx.ReadCommitted, nil, sql), "FN002")
		require.NoError(t, attempt(ctx, f.uConn, pgx.ReadCommitted, []string{use}, sql), sql)
	}
	require.NoError(t, attempt(ctx, f.uConn, pgx.ReadCommitted, nil, `SELECT public.owner_assign('U')`))
	require.True(t, strings.HasSuffix(f.kids(t), "1:1:U,2:2:U,3:3:U"), f.kids(t))
}
