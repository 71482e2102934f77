package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// lineHandler writes what gofence logs (its Logger, WARN and above) as the
// CLI's own lines: "pgfence: message (key=value, ...)", one line each, with
// the prefixes of the layers below dropped and Go API names renamed to
// flags, like every other line of the CLI.
type lineHandler struct {
	w     io.Writer
	attrs []slog.Attr
	// skip drops records that the command reports in its own words (pgfence
	// run's watchdog reports a lost lease).
	skip func(slog.Record) bool
}

// newLogger is the Logger the CLI gives gofence.
func newLogger(w io.Writer, skip func(slog.Record) bool) *slog.Logger {
	return slog.New(&lineHandler{w: w, skip: skip})
}

func (h *lineHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (h *lineHandler) Handle(_ context.Context, r slog.Record) error {
	if h.skip != nil && h.skip(r) {
		return nil
	}
	var kv []string
	add := func(a slog.Attr) bool {
		kv = append(kv, a.Key+"="+a.Value.String())
		return true
	}
	for _, a := range h.attrs {
		add(a)
	}
	r.Attrs(add)
	line := r.Message
	if len(kv) > 0 {
		line += " (" + strings.Join(kv, ", ") + ")"
	}
	line = apiToFlags.Replace(strings.ReplaceAll(strings.Join(strings.Fields(line), " "), "pgfence: ", ""))
	_, err := fmt.Fprintln(h.w, "pgfence: "+line)
	return err
}

func (h *lineHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &lineHandler{w: h.w, attrs: append(h.attrs[:len(h.attrs):len(h.attrs)], attrs...), skip: h.skip}
}

// WithGroup keeps the handler as it is: gofence logs no groups, and a line
// names its keys plainly.
func (h *lineHandler) WithGroup(string) slog.Handler { return h }
