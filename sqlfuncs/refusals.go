package sqlfuncs

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// Refusal is one row of the view fence.refusals (migration 8): how many
// tokens this database refused with one SQLSTATE since the kit was
// installed. A refused write rolls its transaction back, so the kit counts
// it in a sequence on the failing path, which no rollback undoes; see
// docs/sql.md, "fence.refusals", for what is counted and what is not.
type Refusal struct {
	// SQLState is CodeStaleToken, CodeNoToken or CodeUnknownToken.
	SQLState string
	// Reason is the view's words for it ("stale token", "no token",
	// "token never granted").
	Reason string
	// Count only grows (it may jump by up to 32 after a crash, as any
	// sequence does).
	Count int64
}

// Refusals reads every row of fence.refusals, ordered by SQLSTATE: one for
// each of FN001, FN002 and FN003, zero counts included. Roles granted usage
// may read it; it writes nothing.
func Refusals(ctx context.Context, db Querier) ([]Refusal, error) {
	rows, err := db.Query(ctx, `SELECT sqlstate, reason, count FROM fence.refusals ORDER BY sqlstate`)
	if err != nil {
		return nil, Translate(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Refusal, error) {
		var f Refusal
		err := r.Scan(&f.SQLState, &f.Reason, &f.Count)
		return f, err
	})
	return out, Translate(err)
}
