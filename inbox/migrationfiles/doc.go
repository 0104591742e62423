// Package migrationfiles renders the inbox schema as the migration files
// of other tools, for programs that keep their schema with goose,
// golang-migrate or Atlas rather than calling [inbox.Store.Migrate]:
//
//	files, err := migrationfiles.Render(postgres.Dialect(), "inbox", migrationfiles.FormatGoose)
//	paths, err := migrationfiles.Write("migrations/inbox", postgres.Dialect(), "inbox", migrationfiles.FormatGoose)
//
// The files are rendered from the dialect's own migrations
// ([inbox.Dialect.Migrations], read by [inbox.LoadMigrations]) for one
// table, so they hold the table's name rather than a marker, and there
// are as many as the dialect has versions. They hold the statements
// Store.Migrate runs, in its order, each ended by a semicolon. The package
// does no I/O but [Write], and imports no tool and no driver.
//
// # Formats
//
//   - [FormatSQL]: NNN_name.up.sql and NNN_name.down.sql, for running by hand
//     (psql -f, mysql <, sqlite3) or by a tool that runs several statements
//     per file.
//   - [FormatGoose]: one NNN_name.sql per version, "-- +goose Up" then
//     "-- +goose Down". A statement goose would cut at an inner semicolon
//     (one followed by a comment, in a function's body) stands between
//     "-- +goose StatementBegin" and "-- +goose StatementEnd". goose runs a
//     file in a transaction, on one connection; keep it so (no
//     "-- +goose NO TRANSACTION"): on MySQL a version's statements share
//     session variables.
//   - [FormatGolangMigrate]: NNN_name.up.sql and NNN_name.down.sql. On
//     PostgreSQL and SQLite golang-migrate runs a file whole, as the plain
//     files need, and they are the [FormatSQL] files. On MySQL it sends a
//     file as one statement, which fails for several unless the DSN has
//     multiStatements=true (its mysql:// URLs set it, an [database/sql.DB]
//     given to WithInstance may not), after marking the database dirty.
//     So the mysql dialect's files hold one statement each: inbox version
//     v becomes golang-migrate versions 10v+1 (define a stored procedure
//     that runs the version's statements, or undoes them), 10v+2 (call it)
//     and 10v+3 (drop it), each down file undoing exactly its up file.
//     Version v is complete at golang-migrate version 10v+3, where no
//     procedure is left; move between such versions (m.Migrate(10*v+3)).
//     The migrating user needs the CREATE ROUTINE privilege; with
//     automatic_sp_privileges (the default) the creator may then call and
//     drop the procedure.
//   - [FormatAtlas]: an Atlas versioned migration directory, one NNN_name.sql
//     per version and [AtlasSumName], with the hashes Atlas computes. Atlas
//     has no down files: it plans a down from the schema, and that plan
//     does not delete rows of "<table>_migrations" (see below); after a
//     partial "atlas migrate down", delete the rows of the versions above
//     the target, or undo with [inbox.Store.MigrateDown] instead. Keep
//     Atlas's default transaction per file (--tx-mode file), for the same
//     reason as goose's. A database holding other tables needs
//     --allow-dirty or --baseline the first time, as Atlas requires.
//
// # Validate and the versions table
//
// Every rendered version also records itself in "<table>_migrations", the
// table Store.Migrate keeps, at the end of its up file, and forgets itself
// at the start of its down file; undoing the first version drops that
// table, as MigrateDown(ctx, 0) does. So [inbox.Store.Validate] and
// [inbox.Store.AppliedMigrations] report the same whether a tool or
// Store.Migrate applied the schema: call Validate at start-up either way.
// The tool keeps its own bookkeeping besides (goose_db_version,
// schema_migrations, atlas_schema_revisions); the two agree as long as
// the tool alone applies and undoes the files. A recording deletes the
// version's row before it inserts it, and the shipped migrations check
// before each step whether it is still needed, so a tool can take over a
// table Store.Migrate created: its first run changes nothing and records
// every version once. On MySQL, whose DDL commits by itself, a crash
// inside a version leaves it applied but unrecorded, in the tool's table
// as in "<table>_migrations": run the tool again (golang-migrate first
// wants "force" to the last complete version).
//
// # A directory of its own
//
// The inbox's versions start at 1, as an application's own migrations
// usually do. Keep the files in a directory of their own, with a version
// table of their own: goose's -table flag (goose.WithTableName),
// golang-migrate's x-migrations-table parameter (Config.MigrationsTable),
// a separate Atlas directory and revisions schema. After an upgrade of
// inboxmill, render the directory again: new versions are added, and a
// file of an applied version that changed shows in a diff (and, for
// Atlas, in atlas.sum).
package migrationfiles
