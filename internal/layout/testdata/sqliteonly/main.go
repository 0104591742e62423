// Command sqliteonly is what a program using inboxmill on SQLite imports:
// the middleware, the store, the SQLite dialect and its driver. It prints
// the database/sql drivers that got registered, one a line.
package main

import (
	"database/sql"
	"fmt"

	_ "modernc.org/sqlite"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/sqlite"
)

func main() {
	db, err := sql.Open("sqlite", sqlite.DSN(":memory:"))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	store, err := inbox.NewStore(db, sqlite.Dialect(), inbox.Config{})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	if _, err := dedup.New(store, dedup.Config{Key: dedup.KeyFromMetadata("event_id")}); err != nil {
		panic(err)
	}
	for _, d := range sql.Drivers() {
		fmt.Println(d)
	}
}
