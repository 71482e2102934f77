package sqlfuncs

import "context"

// VersionTable reports where golang-migrate keeps its version table named
// table for db's role, and whether it exists: schema is current_schema()
// ("" when search_path names no existing schema), which is where
// golang-migrate looks; exists is read from pg_class, so it does not
// depend on whether this role may read the table.
//
// A kit whose fence.version() answers while no version table exists was
// installed without golang-migrate (its files applied by psql or copied
// into another tool): see gofence.ErrVersionNotRecorded.
func VersionTable(ctx context.Context, db DB, table string) (schema string, exists bool, err error) {
	err = db.QueryRow(ctx, `SELECT coalesce(pg_catalog.current_schema(), ''),
		EXISTS (SELECT FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = pg_catalog.current_schema() AND c.relname = $1)`, table).Scan(&schema, &exists)
	return schema, exists, err
}
