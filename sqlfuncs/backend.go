package sqlfuncs

import "context"

// BackendPID calls pg_backend_pid(): the process id of the backend that
// runs the statement (behind a pooler, not necessarily the one announced at
// connect). It is the one binding here of a server function rather than a
// function of schema fence: gofence's check of a connection pooler needs
// it, and the library's SQL text lives in this package. Like the kit's
// bindings it sends one statement; its error is pgx's, as it is.
func BackendPID(ctx context.Context, db DB) (uint32, error) {
	var pid uint32
	err := db.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid)
	return pid, err
}
