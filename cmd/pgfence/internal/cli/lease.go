package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgfence/pgfence/gofence"
)

// leaseJSON is the --json shape of acquire, renew, release and revoke.
type leaseJSON struct {
	Resource  string     `json:"resource"`
	Token     int64      `json:"token,omitempty"`
	Holder    string     `json:"holder,omitempty"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	Released  *bool      `json:"released,omitempty"`
}

func newAcquireCmd(g *globals) *cobra.Command {
	var (
		ttl, timeout time.Duration
		holder       string
		wait         bool
	)
	cmd := &cobra.Command{
		Use:   "acquire RESOURCE",
		Short: "Take a lease and print its fencing token",
		Long: `acquire takes a TTL lease on RESOURCE and prints its fencing token. The
lease is not kept alive after the command exits: renew it (pgfence renew)
before the TTL runs out, or use pgfence run to hold it while a command runs.
Exit code 3 when another live lease holds the resource, or when the
previous holder's guarded transaction is still open (busy: try again);
--wait waits through both.`,
		Example: `  TOKEN=$(pgfence acquire nightly-report --ttl 5m)
  pgfence acquire nightly-report --wait --timeout 30s --json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if timeout > 0 && !wait {
				return usageError{errors.New("--timeout goes with --wait")}
			}
			ctx := cmd.Context()
			return g.withClient(ctx, gofence.Config{TTL: ttl, Holder: holder}, func(c *gofence.Client) error {
				l, err := takeLease(ctx, c, args[0], wait, timeout)
				var held *gofence.HeldError
				switch {
				case wait && timeout > 0 && errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
					return exitError{ExitHeld, fmt.Errorf("%s was not granted within %s (--timeout; another holder kept it)", args[0], timeout)}
				case errors.As(err, &held):
					return exitError{ExitHeld, errors.New(heldMessage(held))}
				case errors.Is(err, gofence.ErrBusy):
					return exitError{ExitHeld, err}
				}
				if err != nil {
					return err
				}
				exp := l.ExpiresAt()
				if info, ok, err := c.LeaseOf(ctx, args[0]); err == nil && ok {
					exp = info.ExpiresAt
				}
				return g.emit(leaseJSON{Resource: l.Resource(), Token: l.Token(), Holder: l.Holder(), ExpiresAt: &exp}, func(w io.Writer) error {
					_, err := fmt.Fprintln(w, l.Token())
					return err
				})
			})
		},
	}
	cmd.Flags().DurationVar(&ttl, "ttl", 30*time.Second, "lease time to live (10ms to 24h)")
	cmd.Flags().StringVar(&holder, "holder", "", "holder name shown in status (default host/pid/random)")
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until the lease is granted")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "with --wait: give up after this long (exit 3)")
	return cmd
}

// takeLease tries once, or with wait waits (giving up after timeout when it
// is positive, with an error matching context.DeadlineExceeded).
func takeLease(ctx context.Context, c *gofence.Client, resource string, wait bool, timeout time.Duration) (*gofence.Lease, error) {
	if !wait {
		return c.Acquire(ctx, resource, nil)
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	return c.Acquire(ctx, resource, &gofence.LeaseOptions{Wait: true})
}

// heldMessage says who holds the resource and how to wait for it, in the
// CLI's words: HeldError's own message with the Go API renamed to flags.
func heldMessage(e *gofence.HeldError) string {
	return apiToFlags.Replace(strings.TrimPrefix(e.Error(), "pgfence: "))
}

// tokenFlag reads --token, which renew and release require.
func tokenFlag(cmd *cobra.Command) (int64, error) {
	s, _ := cmd.Flags().GetString("token")
	if s == "" {
		return 0, usageError{errors.New("--token is required (the token that pgfence acquire printed)")}
	}
	t, err := strconv.ParseInt(s, 10, 64)
	if err != nil || t <= 0 {
		return 0, usageError{fmt.Errorf("--token %q is not a positive integer", s)}
	}
	return t, nil
}

func newRenewCmd(g *globals) *cobra.Command {
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:     "renew RESOURCE --token TOKEN",
		Short:   "Extend a lease held with TOKEN; print its new expiry",
		Long:    "renew extends the live lease held with TOKEN by --ttl from now (server clock). Exit code 3 when TOKEN is no longer the live lease: stop working under it.",
		Example: `  pgfence renew nightly-report --token "$TOKEN" --ttl 5m`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			tok, err := tokenFlag(cmd)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			return g.withClient(ctx, gofence.Config{TTL: ttl}, func(c *gofence.Client) error {
				exp, err := c.RenewToken(ctx, args[0], tok)
				if errors.Is(err, gofence.ErrLost) {
					return exitError{ExitHeld, err}
				}
				if err != nil {
					return err
				}
				return g.emit(leaseJSON{Resource: args[0], Token: tok, ExpiresAt: &exp}, func(w io.Writer) error {
					_, err := fmt.Fprintln(w, exp.Format(time.RFC3339Nano))
					return err
				})
			})
		},
	}
	cmd.Flags().String("token", "", "the lease's token (required)")
	cmd.Flags().DurationVar(&ttl, "ttl", 30*time.Second, "new time to live from now (10ms to 24h)")
	return cmd
}

func newReleaseCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "release RESOURCE --token TOKEN",
		Short: "End a lease held with TOKEN",
		Long: `release ends the live lease held with TOKEN and wakes waiters. It is
idempotent: releasing a lease that already ended (released, expired,
superseded) prints "not live" and exits 0, and never touches a newer lease.`,
		Example: `  pgfence release nightly-report --token "$TOKEN"`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			tok, err := tokenFlag(cmd)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			return g.withClient(ctx, gofence.Config{}, func(c *gofence.Client) error {
				released, err := c.ReleaseToken(ctx, args[0], tok)
				if err != nil {
					return err
				}
				return g.emit(leaseJSON{Resource: args[0], Token: tok, Released: &released}, func(w io.Writer) error {
					msg := "released"
					if !released {
						msg = "not live (already released, expired or superseded): nothing to do"
					}
					_, err := fmt.Fprintln(w, msg)
					return err
				})
			})
		},
	}
	cmd.Flags().String("token", "", "the lease's token (required)")
	return cmd
}

func newRevokeCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "revoke RESOURCE",
		Short: "Operator action: make every outstanding token of RESOURCE stale",
		Long: `revoke ends any lease of RESOURCE and grants a new token to nobody: every
token handed out before is stale at once, and the database refuses writes
under them. It waits at most fence.grant_wait for a guarded transaction under
the current token, then fails (SQLSTATE FN004). Needs the operator usage
privilege (fence.grant_usage(role, operator => true)).`,
		Example: `  pgfence revoke nightly-report`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return g.withClient(ctx, gofence.Config{}, func(c *gofence.Client) error {
				tok, err := c.Revoke(ctx, args[0])
				if err != nil {
					return err
				}
				return g.emit(leaseJSON{Resource: args[0], Token: tok}, func(w io.Writer) error {
					_, err := fmt.Fprintln(w, tok)
					return err
				})
			})
		},
	}
}

// statusJSON is the --json shape of one status row.
type statusJSON struct {
	Resource         string     `json:"resource"`
	Holder           string     `json:"holder"`
	Token            int64      `json:"token"`
	Kind             string     `json:"kind"`
	Live             bool       `json:"live"`
	AcquiredAt       time.Time  `json:"acquired_at"`
	ExpiresAt        *time.Time `json:"expires_at,omitempty"`
	ExpiresInSeconds *float64   `json:"expires_in_seconds,omitempty"`
	EndedAt          *time.Time `json:"ended_at,omitempty"`
}

func newStatusCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "status [RESOURCE]",
		Short: "Show every lease (or one): holder, token, live or not, expiry by the server's clock",
		Example: `  pgfence status
  pgfence status nightly-report --json`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return g.withClient(ctx, gofence.Config{}, func(c *gofence.Client) error {
				var infos []gofence.LeaseInfo
				if len(args) == 1 {
					info, ok, err := c.LeaseOf(ctx, args[0])
					if err != nil {
						return err
					}
					if !ok {
						return exitError{ExitError, fmt.Errorf("%s has never been granted", args[0])}
					}
					infos = []gofence.LeaseInfo{info}
				} else {
					var err error
					if infos, err = c.Leases(ctx); err != nil {
						return err
					}
				}
				rows := make([]statusJSON, len(infos))
				for i, in := range infos {
					r := statusJSON{Resource: in.Resource, Holder: in.Holder, Token: in.Token, Kind: in.Kind, Live: in.Live, AcquiredAt: in.AcquiredAt}
					switch {
					case !in.EndedAt.IsZero():
						// Released or revoked: it ended then, whatever its TTL
						// would have said.
						ended := in.EndedAt
						r.EndedAt = &ended
					case !in.ExpiresAt.IsZero():
						exp := in.ExpiresAt
						r.ExpiresAt = &exp
						if in.Live {
							left := in.ExpiresAt.Sub(in.ServerNow).Seconds()
							r.ExpiresInSeconds = &left
						}
					}
					rows[i] = r
				}
				return g.emit(rows, func(w io.Writer) error {
					tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
					fmt.Fprintln(tw, "RESOURCE\tHOLDER\tTOKEN\tKIND\tSTATE\tEXPIRES IN")
					for _, r := range rows {
						state, expires := "free", "-"
						switch {
						case r.Live:
							state = "live"
						case r.Kind == "revoked":
							state = "revoked"
						case r.EndedAt != nil:
							state = "released"
						case r.ExpiresAt != nil:
							state = "expired"
						}
						if r.ExpiresInSeconds != nil {
							expires = (time.Duration(*r.ExpiresInSeconds * float64(time.Second))).Round(time.Millisecond).String()
						} else if r.Kind == "session" && r.Live {
							expires = "with its session"
						}
						holder, kind := r.Holder, r.Kind
						if holder == "" {
							holder = "-"
						}
						if kind == "revoked" {
							// A revoke grants its token to nobody: no lease, of
							// either kind; STATE says revoked.
							kind = "-"
						}
						fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", r.Resource, holder, r.Token, kind, state, expires)
					}
					return tw.Flush()
				})
			})
		},
	}
}

func newProtectCmd(g *globals) *cobra.Command {
	var resource, column, perRow, prefix string
	cmd := &cobra.Command{
		Use:   "protect TABLE (--resource RESOURCE | --per-row COLUMN [--prefix PREFIX]) [--token-column COLUMN]",
		Short: "Make the database refuse writes to TABLE that lack the latest token of RESOURCE (or of each row's resource)",
		Long: `protect installs pgfence's guard triggers on TABLE.

With --resource, the whole table is one resource (fence.protect). With
--per-row COLUMN, every row is its own resource, PREFIX followed by the row's
COLUMN (fence.protect_rows): with --per-row id --prefix invoice: row 42 is
resource invoice:42, leased like any other (pgfence run invoice:42 ...).

With --token-column, INSERT and UPDATE take the token from that bigint column
of the row (an UPDATE must assign it); without it, and for DELETE and
TRUNCATE, the writing transaction must call fence.use_token(RESOURCE, token)
first (per row: for the row's resource). Only the table's owner may protect
it.`,
		Example: `  pgfence protect public.orders --resource orders --token-column fence_token
  pgfence protect order_lines --resource orders
  pgfence protect public.invoice --per-row id --prefix invoice: --token-column fence_token`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch {
			case resource == "" && perRow == "":
				return usageError{errors.New("--resource is required (or --per-row COLUMN for a resource per row)")}
			case resource != "" && perRow != "":
				return usageError{errors.New("--resource and --per-row exclude each other: one resource for the table, or one per row")}
			case prefix != "" && perRow == "":
				return usageError{errors.New("--prefix needs --per-row")}
			}
			ctx := cmd.Context()
			return g.withClient(ctx, gofence.Config{}, func(c *gofence.Client) error {
				var err error
				if perRow != "" {
					err = c.ProtectRows(ctx, args[0], perRow, prefix, column)
				} else {
					err = c.Protect(ctx, args[0], resource, column)
				}
				if err != nil {
					return err
				}
				out := map[string]string{"table": args[0], "resource": resource, "token_column": column}
				if perRow != "" {
					out = map[string]string{"table": args[0], "resource_column": perRow, "prefix": prefix, "token_column": column}
				}
				return g.emit(out, func(w io.Writer) error {
					mode := "token from fence.use_token"
					if column != "" {
						mode = "token from column " + column
					}
					what := "with resource " + resource
					if perRow != "" {
						what = fmt.Sprintf("per row: resource %s<%s>", prefix, perRow)
					}
					_, err := fmt.Fprintf(w, "protected %s %s (%s)\n", args[0], what, mode)
					return err
				})
			})
		},
	}
	cmd.Flags().StringVar(&resource, "resource", "", "the resource whose token writes need (one for the whole table)")
	cmd.Flags().StringVar(&perRow, "per-row", "", "a resource per row: the column whose value names the row's resource")
	cmd.Flags().StringVar(&prefix, "prefix", "", "with --per-row: text put before the column's value in the resource's name")
	cmd.Flags().StringVar(&column, "token-column", "", "bigint column that carries the token on INSERT and UPDATE")
	return cmd
}

func newUnprotectCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "unprotect TABLE",
		Short:   "Remove the guard triggers from TABLE",
		Example: `  pgfence unprotect public.orders`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return g.withClient(ctx, gofence.Config{}, func(c *gofence.Client) error {
				if err := c.Unprotect(ctx, args[0]); err != nil {
					return err
				}
				return g.emit(map[string]string{"table": args[0]}, func(w io.Writer) error {
					_, err := fmt.Fprintf(w, "unprotected %s\n", args[0])
					return err
				})
			})
		},
	}
}
