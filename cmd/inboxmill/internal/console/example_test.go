package console_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"

	"github.com/inboxmill/inboxmill/cmd/inboxmill/internal/console"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/sqlite"
)

// Serving the console: refuse an open address without a token, then mount
// the handler.
func ExampleNew() {
	dir, _ := os.MkdirTemp("", "inboxmill-console")
	defer os.RemoveAll(dir)
	db, _ := sql.Open("sqlite", sqlite.DSN(filepath.Join(dir, "inbox.db")))
	defer db.Close()
	store, _ := inbox.NewStore(db, sqlite.Dialect(), inbox.Config{})
	defer store.Close()
	if err := store.Migrate(context.Background()); err != nil {
		fmt.Println(err)
		return
	}

	addr, token := "127.0.0.1:8080", ""
	if err := console.CheckBind(addr, token); err != nil {
		fmt.Println(err)
		return
	}
	h, err := console.New(console.Config{Store: store, Token: token})
	if err != nil {
		fmt.Println(err)
		return
	}
	srv := httptest.NewServer(h) // in a program: &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: ...}
	defer srv.Close()

	res, err := http.Get(srv.URL + "/healthz")
	if err != nil {
		fmt.Println(err)
		return
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	fmt.Print(res.StatusCode, " ", string(body))
	// Output: 200 ok
}

func ExampleCheckBind() {
	fmt.Println(console.CheckBind("127.0.0.1:8080", ""))
	fmt.Println(console.CheckBind("0.0.0.0:8080", ""))
	fmt.Println(console.CheckBind("0.0.0.0:8080", "s3cret"))
	fmt.Println(console.CheckBind("0.0.0.0:8080", "8c1d3f0e6a9b47d2a5e4c7b8f1029d3e"))
	fmt.Println(console.CheckBind("127.0.0.1:8080", "s3cret"))
	// Output:
	// <nil>
	// console: a token of at least 16 bytes is required to listen beyond the loopback interface: 0.0.0.0 is not a loopback address; pass a token (--token or INBOXMILL_TOKEN; `openssl rand -hex 32` makes one) or bind to 127.0.0.1
	// console: a token of at least 16 bytes is required: the token has 6 bytes, too few to guard 0.0.0.0; `openssl rand -hex 32` makes a good one
	// <nil>
	// console: a token of at least 16 bytes is required: the token has 6 bytes, too few to guard 127.0.0.1; `openssl rand -hex 32` makes a good one
}
