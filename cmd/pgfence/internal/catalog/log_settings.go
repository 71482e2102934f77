package catalog

import "context"

// LogSettings are the settings that decide whether a refused write reaches
// the server log, and with its SQLSTATE (ReadLogSettings). Each is the
// value current_setting gives the reading session.
type LogSettings struct {
	// Destination is log_destination ("stderr", "csvlog,jsonlog", ...).
	Destination string
	// Collector is logging_collector ("on" or "off"); csvlog and jsonlog
	// need it.
	Collector string
	// LinePrefix is log_line_prefix; %e in it prints the SQLSTATE.
	LinePrefix string
	// MinMessages is log_min_messages, MinErrorStatement
	// log_min_error_statement (lower case: "warning", "error", ...).
	MinMessages, MinErrorStatement string
}

// ReadLogSettings reads the logging settings of LogSettings in one
// statement. Any role may read them.
func ReadLogSettings(ctx context.Context, db DB) (LogSettings, error) {
	var s LogSettings
	err := db.QueryRow(ctx, `SELECT current_setting('log_destination'), current_setting('logging_collector'),
		current_setting('log_line_prefix'), lower(current_setting('log_min_messages')), lower(current_setting('log_min_error_statement'))`).Scan(
		&s.Destination, &s.Collector, &s.LinePrefix, &s.MinMessages, &s.MinErrorStatement)
	return s, err
}
