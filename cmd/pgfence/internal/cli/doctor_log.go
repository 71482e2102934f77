package cli

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/catalog"
)

// severities are PostgreSQL's message levels in the order that
// log_min_messages and log_min_error_statement compare them (note LOG
// between ERROR and FATAL there).
var severities = map[string]int{
	"debug5": 0, "debug4": 1, "debug3": 2, "debug2": 3, "debug1": 4,
	"info": 5, "notice": 6, "warning": 7, "error": 8, "log": 9, "fatal": 10, "panic": 11,
}

// logsErrors reports whether a log_min_* setting of level lets an ERROR
// through; a level it does not know counts as not.
func logsErrors(level string) bool {
	rank, ok := severities[level]
	return ok && rank <= severities["error"]
}

// doctorServerLog reports whether a refused write reaches the server log
// with its SQLSTATE and its statement, the trace that a refusal leaves
// outside the client that made it (pg_stat_statements counts successful
// statements only): log_min_messages lets ERROR through; csvlog or jsonlog
// is written (they carry the SQLSTATE in a field of their own; they need
// logging_collector, without which PostgreSQL writes plain lines to stderr
// instead), or log_line_prefix has %e; log_min_error_statement is error or
// lower, so the statement is logged with the error. The values are the
// ones of doctor's own session: a role or database may set others.
func doctorServerLog(ctx context.Context, pool *pgxpool.Pool, add func(check, status, detail, fix string)) {
	s, err := catalog.ReadLogSettings(ctx, pool)
	if err != nil {
		add("server log", "warn", "the logging settings cannot be read: "+oneLine(err), "")
		return
	}
	const reload = "; SELECT pg_reload_conf() (as a superuser; on a managed service, in its parameter group)"
	if !logsErrors(s.MinMessages) {
		add("server log", "warn", fmt.Sprintf("log_min_messages = %s: refused writes (ERROR) do not reach the server log", s.MinMessages),
			"ALTER SYSTEM SET log_min_messages = warning"+reload)
		return
	}
	dests := map[string]bool{}
	for _, d := range strings.Split(s.Destination, ",") {
		dests[strings.ToLower(strings.TrimSpace(d))] = true
	}
	var how string
	switch {
	case s.Collector == "on" && dests["jsonlog"]:
		how = "jsonlog writes it as state_code"
	case s.Collector == "on" && dests["csvlog"]:
		how = "csvlog writes it as sql_state_code"
	case strings.Contains(s.LinePrefix, "%e"):
		how = "log_line_prefix has %e"
	}
	good := true
	if how == "" {
		good = false
		prefix := s.LinePrefix
		switch {
		case prefix == "":
		case strings.HasSuffix(prefix, " "):
		default:
			prefix += " "
		}
		add("server log", "warn", fmt.Sprintf("refused writes reach the server log without their SQLSTATE (FN001, ...): log_line_prefix = %s has no %%e, and no csvlog or jsonlog is written (log_destination = %s, logging_collector = %s)",
			quoteLiteral(s.LinePrefix), quoteLiteral(s.Destination), s.Collector),
			fmt.Sprintf("ALTER SYSTEM SET log_line_prefix = %s%s; or log_destination = 'jsonlog' (PostgreSQL 15+) or 'csvlog' with logging_collector = on (a restart)", quoteLiteral(prefix+"%e "), reload))
	}
	if !logsErrors(s.MinErrorStatement) {
		good = false
		add("server log", "warn", fmt.Sprintf("log_min_error_statement = %s: a refused write is logged without its statement", s.MinErrorStatement),
			"ALTER SYSTEM SET log_min_error_statement = error"+reload)
	}
	if good {
		add("server log", "ok", fmt.Sprintf("refused writes reach the server log with their SQLSTATE (%s) and their statement", how), "")
	}
}
