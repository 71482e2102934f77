package cli_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/cli"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// doctorFinding is one finding of doctor --json.
type doctorFinding struct {
	Check, Status, Detail, Fix string
}

func doctorFindingOf(t *testing.T, url, check string) doctorFinding {
	t.Helper()
	_, out, errOut := run(t, "doctor", "--json", "--database-url", url)
	var fs []doctorFinding
	require.NoError(t, json.Unmarshal([]byte(out), &fs), "stdout: %s\nstderr: %s", out, errOut)
	for _, f := range fs {
		if f.Check == check {
			return f
		}
	}
	t.Fatalf("doctor printed no %q check: %s", check, out)
	return doctorFinding{}
}

// TestTokenBudgetInDoctorAndStatus (issue 32, the counter's budget): doctor
// reports fence.token_budget() as its token budget check (ok with room,
// warn when few counter moves are left, fail when none is), and status
// shows the same figures as Prometheus gauges, in every --watch --json line
// and in the --watch frame, as a role granted usage and nothing more.
func TestTokenBudgetInDoctorAndStatus(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.Setup(t)
	reader := pgtest.NewRole(t, "budget")
	require.NoError(t, sqlfuncs.GrantUsage(ctx, db.Pool, reader, false))
	_, ok, err := sqlfuncs.Acquire(ctx, db.Pool, "budget", "me", time.Hour)
	require.NoError(t, err)
	require.True(t, ok)
	url := db.URLAs(reader)
	want, err := sqlfuncs.TokenBudget(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, int64(2047), want.CounterMovesLeft, "a fresh install")

	t.Run("doctor: ok with room left", func(t *testing.T) {
		f := doctorFindingOf(t, url, "token budget")
		require.Equal(t, "ok", f.Status, f.Detail)
		require.Equal(t, fmt.Sprintf("epoch %d (%d epochs left), 2047 counter moves (crash restarts) left, %d grants left", want.Epoch, want.EpochsLeft, want.GrantsLeft), f.Detail)
	})

	t.Run("status: the Prometheus gauges", func(t *testing.T) {
		code, out, errOut := run(t, "status", "--format", "prometheus", "--database-url", url)
		require.Equal(t, cli.ExitOK, code, errOut)
		fams := parseExposition(t, out)
		for name, v := range map[string]int64{
			"pgfence_token_epoch":              want.Epoch,
			"pgfence_token_epochs_left":        want.EpochsLeft,
			"pgfence_token_counter_moves_left": want.CounterMovesLeft,
			"pgfence_token_grants_left":        want.GrantsLeft,
		} {
			require.Equal(t, map[string]float64{"": float64(v)}, series(t, fams, name), name)
		}
	})

	t.Run("status --watch --json: the budget in every line", func(t *testing.T) {
		wctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
		defer cancel()
		var out, errOut bytes.Buffer
		code := cli.Run(wctx, []string{"status", "--watch=200ms", "--json", "--database-url", url}, &out, &errOut)
		require.Equal(t, cli.ExitOK, code, errOut.String())
		lines := 0
		sc := bufio.NewScanner(&out)
		for sc.Scan() {
			var l struct {
				Budget *struct {
					Epoch            int64 `json:"epoch"`
					EpochsLeft       int64 `json:"epochs_left"`
					Counter          int64 `json:"counter"`
					GrantsLeft       int64 `json:"grants_left"`
					CounterMovesLeft int64 `json:"counter_moves_left"`
				} `json:"budget"`
			}
			require.NoError(t, json.Unmarshal(sc.Bytes(), &l), sc.Text())
			require.NotNil(t, l.Budget, sc.Text())
			require.Equal(t, want.Epoch, l.Budget.Epoch)
			require.Equal(t, want.EpochsLeft, l.Budget.EpochsLeft)
			require.Equal(t, want.Counter, l.Budget.Counter)
			require.Equal(t, want.GrantsLeft, l.Budget.GrantsLeft)
			require.Equal(t, want.CounterMovesLeft, l.Budget.CounterMovesLeft)
			lines++
		}
		require.Positive(t, lines)
	})

	t.Run("status --watch: the budget line of the frame", func(t *testing.T) {
		wctx, cancel := context.WithTimeout(ctx, 700*time.Millisecond)
		defer cancel()
		var out, errOut bytes.Buffer
		code := cli.Run(wctx, []string{"status", "--watch=200ms", "--database-url", url}, &out, &errOut)
		require.Equal(t, cli.ExitOK, code, errOut.String())
		require.Contains(t, out.String(), fmt.Sprintf("\ntoken budget: epoch %d (%d epochs left), 2047 counter moves (crash restarts) left, %d grants left\n",
			want.Epoch, want.EpochsLeft, want.GrantsLeft))
	})

	// Spend the counter as crash restarts would (the kit's owner moves it by
	// hand): few moves left warns, none fails.
	setCounter := func(t *testing.T, v int64) {
		t.Helper()
		_, err := db.Pool.Exec(ctx, "SELECT setval('fence.token_counter', $1)", v)
		require.NoError(t, err)
	}
	t.Run("doctor: few counter moves left warns", func(t *testing.T) {
		setCounter(t, (1<<43)-2-10*(1<<32))
		f := doctorFindingOf(t, url, "token budget")
		require.Equal(t, "warn", f.Status, f.Detail)
		require.Contains(t, f.Detail, " 10 counter moves (crash restarts) left")
		require.Contains(t, f.Fix, "each crash restart spends a counter move")
	})
	t.Run("doctor: none left fails, and says what the next grant does", func(t *testing.T) {
		setCounter(t, (1<<43)-2)
		f := doctorFindingOf(t, url, "token budget")
		require.Equal(t, "fail", f.Status, f.Detail)
		require.Contains(t, f.Detail, " 0 counter moves (crash restarts) left")
		require.True(t, strings.HasSuffix(f.Detail, "the next grant that needs more fails (SQLSTATE 54000)"), f.Detail)
		code, _, _ := run(t, "doctor", "--database-url", url)
		require.Equal(t, cli.ExitError, code, "a failed check fails doctor")
	})
}
