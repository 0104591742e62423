package inboxtest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"testing"

	"github.com/inboxmill/inboxmill/inbox"
)

// NewStore returns a store over db in dialect d, migrated, for a test of
// your own: a handler's, under redelivery (see package dedup/deduptest).
// An empty cfg.Table gets a table of its own ([UniqueTable]), so tests
// can run in parallel against one database. When the test ends the store
// is closed and its tables are dropped; db is left open.
//
//	db, _ := sql.Open("sqlite", sqlite.DSN(filepath.Join(t.TempDir(), "inbox.db")))
//	store := inboxtest.NewStore(t, db, sqlite.Dialect(), inbox.Config{})
func NewStore(t testing.TB, db *sql.DB, d inbox.Dialect, cfg inbox.Config) *inbox.Store {
	t.Helper()
	if cfg.Table == "" {
		cfg.Table = UniqueTable("inbox")
	}
	store, err := inbox.NewStore(db, d, cfg)
	if err != nil {
		t.Fatalf("inboxtest: new store: %v", err)
	}
	t.Cleanup(func() {
		_ = store.Close()
		_ = store.MigrateDown(context.Background(), 0)
	})
	if err := store.Migrate(context.Background()); err != nil {
		t.Fatalf("inboxtest: migrate: %v", err)
	}
	return store
}

// UniqueTable returns prefix plus a random suffix: a valid table name
// (at most 22 bytes for a short prefix) that no other test uses.
func UniqueTable(prefix string) string {
	var r [5]byte
	_, _ = rand.Read(r[:])
	return prefix + "_" + hex.EncodeToString(r[:])
}
