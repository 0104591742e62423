package migrationfiles_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/inboxmill/inboxmill/inbox/migrationfiles"
	"github.com/inboxmill/inboxmill/inbox/mysql"
	"github.com/inboxmill/inboxmill/inbox/sqlite"
)

// Render the first goose migration of the SQLite schema for the table
// "orders_inbox": its statements carry the table's name, between goose's
// annotations.
func ExampleRender() {
	files, err := migrationfiles.Render(sqlite.Dialect(), "orders_inbox", migrationfiles.FormatGoose)
	if err != nil {
		panic(err)
	}
	first := files[0]
	fmt.Println(first.Name)
	for line := range strings.Lines(string(first.Body)) {
		if strings.HasPrefix(line, "-- +goose") || strings.HasPrefix(line, "CREATE TABLE IF NOT EXISTS") {
			fmt.Print(line)
		}
	}
	// Output:
	// 001_create_inbox.sql
	// -- +goose Up
	// CREATE TABLE IF NOT EXISTS "orders_inbox" (
	// CREATE TABLE IF NOT EXISTS "orders_inbox_migrations" (
	// -- +goose Down
}

// Write golang-migrate files for MySQL into a directory of their own.
// Each version is three single-statement versions, so the DSN needs no
// multiStatements=true.
func ExampleWrite() {
	dir, err := os.MkdirTemp("", "inbox-migrations")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	paths, err := migrationfiles.Write(dir, mysql.Dialect(), "inbox", migrationfiles.FormatGolangMigrate)
	if err != nil {
		panic(err)
	}
	for _, p := range paths[:6] {
		fmt.Println(filepath.Base(p))
	}
	// Output:
	// 0011_create_inbox_define.up.sql
	// 0011_create_inbox_define.down.sql
	// 0012_create_inbox_apply.up.sql
	// 0012_create_inbox_apply.down.sql
	// 0013_create_inbox_cleanup.up.sql
	// 0013_create_inbox_cleanup.down.sql
}

// A Format is a command-line flag's value.
func ExampleParseFormat() {
	f, err := migrationfiles.ParseFormat("golang-migrate")
	fmt.Println(f, err)
	_, err = migrationfiles.ParseFormat("flyway")
	fmt.Println(err)
	// Output:
	// golang-migrate <nil>
	// migrationfiles: unknown format "flyway" (want one of sql, goose, golang-migrate, atlas)
}
