package cli

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/sqlfuncs"
)

// The token budget (fence.token_budget, migration 9): what is left of the
// token space. doctor judges it, status shows it (the --watch frame and
// JSON lines, the Prometheus gauges).

// Thresholds of doctor's token budget check: below them it warns, at zero
// it fails. A counter move is spent by each crash restart, an epoch by each
// promotion (a switchover too) and each restore the kit sees, so the
// warning leaves room for years of them.
const (
	budgetWarnCounterMoves = 64
	budgetWarnEpochs       = 1024
	budgetWarnGrants       = 1 << 32
)

// budgetJSON is the --json shape of fence.token_budget().
type budgetJSON struct {
	Epoch            int64 `json:"epoch"`
	EpochsLeft       int64 `json:"epochs_left"`
	Counter          int64 `json:"counter"`
	GrantsLeft       int64 `json:"grants_left"`
	CounterMovesLeft int64 `json:"counter_moves_left"`
}

// readBudget reads fence.token_budget(); nil, and no error, when the kit
// predates it (version 8 or older: the function does not exist).
func readBudget(ctx context.Context, pool *pgxpool.Pool) (*budgetJSON, error) {
	b, err := sqlfuncs.TokenBudget(ctx, pool)
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42883" { // undefined_function
			return nil, nil
		}
		return nil, err
	}
	return &budgetJSON{Epoch: b.Epoch, EpochsLeft: b.EpochsLeft, Counter: b.Counter, GrantsLeft: b.GrantsLeft, CounterMovesLeft: b.CounterMovesLeft}, nil
}

// String is the budget as status --watch prints it.
func (b *budgetJSON) String() string {
	return fmt.Sprintf("epoch %d (%d epochs left), %d counter moves (crash restarts) left, %d grants left",
		b.Epoch, b.EpochsLeft, b.CounterMovesLeft, b.GrantsLeft)
}

// doctorBudget is doctor's token budget check.
func doctorBudget(ctx context.Context, pool *pgxpool.Pool, version uint, add func(check, status, detail, fix string)) {
	const check = "token budget"
	if version < 9 {
		add(check, "warn", fmt.Sprintf("the kit at version %d cannot say what is left of the token space (fence.token_budget comes with version 9)", version), "pgfence migrate up")
		return
	}
	b, err := readBudget(ctx, pool)
	switch {
	case err != nil:
		add(check, "fail", oneLine(err), "")
		return
	case b == nil:
		add(check, "warn", "fence.token_budget() is missing", "pgfence migrate up")
		return
	}
	const spend = "each crash restart spends a counter move, each promotion (a switchover too) and each restore an epoch, for the install's whole life"
	switch {
	case b.CounterMovesLeft <= 0 || b.EpochsLeft <= 0 || b.GrantsLeft <= 0:
		add(check, "fail", b.String()+": the next grant that needs more fails (SQLSTATE 54000)",
			"install the kit into a new database (or dump and restore the data without schema fence) and move the applications there: "+spend)
	case b.CounterMovesLeft < budgetWarnCounterMoves || b.EpochsLeft < budgetWarnEpochs || b.GrantsLeft < budgetWarnGrants:
		add(check, "warn", b.String(), "plan the move to a new install before it runs out: "+spend)
	default:
		add(check, "ok", b.String(), "")
	}
}
