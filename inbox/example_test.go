package inbox_test

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	_ "modernc.org/sqlite"

	"github.com/inboxmill/inboxmill/inbox"
)

// Claiming directly, without the middleware: the first claim owns the
// intent, the second is a duplicate, a third with another payload conflicts.
func ExampleStore_Claim() {
	dir, _ := os.MkdirTemp("", "inboxmill-example")
	defer os.RemoveAll(dir)
	db, _ := sql.Open("sqlite", inbox.SQLiteDSN(filepath.Join(dir, "example.db")))
	defer db.Close()
	ctx := context.Background()

	store, err := inbox.NewStore(db, inbox.SQLite(), inbox.Config{Table: "inbox"})
	if err != nil {
		panic(err)
	}
	defer store.Close() // its prepared statements
	if err := store.Migrate(ctx); err != nil {
		panic(err)
	}

	claim := func(payload string) {
		h := sha256.Sum256([]byte(payload))
		tx, _ := store.BeginTx(ctx, nil)
		defer tx.Rollback()
		res, err := store.Claim(ctx, tx, inbox.ClaimParams{
			Scope: "tenant-1", Operation: "create_order", Key: "order-intent-42", PayloadHash: h[:],
			Status: inbox.StatusCompleted,
		})
		switch {
		case errors.Is(err, inbox.ErrPayloadConflict):
			fmt.Println("conflict: the key was used for another payload")
		case err != nil:
			fmt.Println("error:", err)
		case res.Claimed:
			fmt.Println("claimed: do the work in tx, then commit")
			_ = tx.Commit()
		default:
			fmt.Println("duplicate: status", res.Record.Status, "attempt", res.Record.Attempt)
		}
	}
	claim(`{"sku":"A","qty":1}`)
	claim(`{"sku":"A","qty":1}`)
	claim(`{"sku":"A","qty":2}`)
	// Output:
	// claimed: do the work in tx, then commit
	// duplicate: status completed attempt 1
	// conflict: the key was used for another payload
}

// Table names are checked before they reach any SQL.
func ExampleNewStore_invalidTable() {
	_, err := inbox.NewStore(&sql.DB{}, inbox.Postgres(), inbox.Config{Table: "inbox; DROP TABLE users"})
	fmt.Println(errors.Is(err, inbox.ErrInvalidConfig))
	// Output:
	// true
}
