package deduptest_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ThreeDotsLabs/watermill/message"
	_ "modernc.org/sqlite"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/dedup/deduptest"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/sqlite"
)

// exampleT stands in for the *testing.T a test passes: examples have none.
type exampleT struct{}

func (exampleT) Helper()                           {}
func (exampleT) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }

// A shipping handler, delivered five times at once as after a consumer
// group's rebalance: every delivery is acked, the handler body runs once,
// and one shipment is written. In a test, pass the test's t, and open the
// store with inboxtest.NewStore.
func ExampleRedeliver() {
	var t deduptest.TB = exampleT{}
	dir, _ := os.MkdirTemp("", "deduptest-example")
	defer os.RemoveAll(dir)
	db, _ := sql.Open("sqlite", sqlite.DSN(filepath.Join(dir, "shop.db")))
	defer db.Close()
	store, _ := inbox.NewStore(db, sqlite.Dialect(), inbox.Config{})
	defer store.Close()
	if err := store.Migrate(context.Background()); err != nil {
		panic(err)
	}
	_, _ = db.Exec(`CREATE TABLE shipments (order_id TEXT NOT NULL)`)

	d, _ := dedup.New(store, dedup.Config{Key: dedup.KeyFromMetadata(deduptest.EventIDKey), Operation: "ship_order"})
	ship := func(msg *message.Message) error {
		tx, _ := dedup.TxFromContext(msg.Context())
		_, err := tx.ExecContext(msg.Context(), `INSERT INTO shipments (order_id) VALUES ('o-1')`)
		return err
	}

	rep := deduptest.Redeliver(t, d, deduptest.NoPublish(ship), deduptest.NewMessage("evt-1", `{"order_id":"o-1"}`),
		deduptest.Times(5), deduptest.Concurrently(), deduptest.UntilAcked(3))

	var shipments int
	_ = db.QueryRow(`SELECT COUNT(*) FROM shipments`).Scan(&shipments)
	fmt.Println("acked:", rep.Acked)
	fmt.Println("handler runs:", rep.Runs)
	fmt.Println("shipments:", shipments)
	// Output:
	// acked: 5
	// handler runs: 1
	// shipments: 1
}
