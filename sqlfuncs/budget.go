package sqlfuncs

import "context"

// Budget is the answer of fence.token_budget() (migration 9): what is left
// of the token space of this install. Tokens are epoch << 43 | counter
// (docs/design.md, "Token layout"); the counter is shared by every resource
// and every epoch, and moves 2^32 ahead at the first grant after each crash
// restart, so its room is the install's whole life. See docs/sql.md,
// "fence.token_budget".
type Budget struct {
	// Epoch is the epoch of the stored epoch state (0 before the first
	// grant): the epoch of the grants made now, unless the next grant finds
	// a promotion or a restore and moves to a later one.
	Epoch int64
	// EpochsLeft is how many later epochs the layout has room for
	// (2^20 - 1 - Epoch); each promotion and each restore the kit sees
	// takes one.
	EpochsLeft int64
	// Counter is the last counter value handed out (0 before the first
	// grant); on a standby the replayed value, up to 32 above it (a
	// sequence logs values ahead of the ones it hands out).
	Counter int64
	// GrantsLeft is how many more grants the counter has room for
	// (2^43 - 1 - Counter), counting no crash restart.
	GrantsLeft int64
	// CounterMovesLeft is how many more crash restarts the counter can move
	// past (2^32 each); at 0 the first grant after a crash restart fails
	// with SQLSTATE 54000 instead of granting.
	CounterMovesLeft int64
	// ReadsBackupLabel says whether the kit's owner may read the server's
	// backup_label.old (pg_read_file), so that a base backup started
	// without recovery starts a new epoch by itself; when false, such a
	// restore needs DELETE FROM fence.origin before its first grant.
	ReadsBackupLabel bool
}

// TokenBudget calls fence.token_budget(). It only reads (on a standby too);
// roles granted usage may call it.
func TokenBudget(ctx context.Context, db DB) (Budget, error) {
	var b Budget
	err := db.QueryRow(ctx, `SELECT epoch, epochs_left, counter, grants_left, counter_moves_left, reads_backup_label FROM fence.token_budget()`).
		Scan(&b.Epoch, &b.EpochsLeft, &b.Counter, &b.GrantsLeft, &b.CounterMovesLeft, &b.ReadsBackupLabel)
	return b, Translate(err)
}
