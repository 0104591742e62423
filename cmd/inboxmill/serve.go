package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"github.com/inboxmill/inboxmill/cmd/inboxmill/internal/console"
)

func (a *app) serveCmd() *cobra.Command {
	var (
		addr, token, actor string
		readOnly, debug    bool
		shutdown           time.Duration
		allowHosts         []string
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the web console: overview, records, resolve and forget forms, audit trail, /metrics, /healthz",
		Long: `serve runs the web console on --addr: an overview of the inbox, a filterable
list of records, a page per record with its audit history, resolve and forget
forms that ask for a reason, the audit trail, Prometheus metrics at /metrics
and a health check at /healthz.

It binds to 127.0.0.1 unless told otherwise; any address beyond the loopback
interface requires --token (or INBOXMILL_TOKEN), which every request but
/healthz must then present (as a bearer token, or through the login page).
A token has at least 16 bytes, on the loopback interface too. Five wrong
tokens in a row from one address lock it out for a minute (429), then for
twice as long at each further one, up to 16 minutes. Without a token the console answers only requests addressed
to 127.0.0.1, [::1] or localhost (and the names --allow-host adds), so that
no other site's page can reach it through a rebound DNS name.
--read-only hides the forms and refuses their requests. SIGINT or SIGTERM
stops it, letting requests under way finish for --shutdown-timeout.`,
		Example: `  inboxmill serve --dsn inbox.db
  INBOXMILL_TOKEN=$(openssl rand -hex 32) inboxmill serve --addr :8080 --read-only`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !cmd.Flags().Changed("token") {
				token = a.getenv("INBOXMILL_TOKEN")
			}
			if err := console.CheckBind(addr, token); err != nil {
				return usageErr(err)
			}
			ctx := cmd.Context()
			i, err := openInbox(ctx, a.db, existing, true)
			if err != nil {
				return err
			}
			defer i.Close()
			level := slog.LevelInfo
			if debug {
				level = slog.LevelDebug
			}
			logger := slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: level}))
			h, err := console.New(console.Config{Store: i.store, Token: token, ReadOnly: readOnly, Logger: logger, Actor: actor,
				AllowedHosts: allowHosts})
			if err != nil {
				return usageErr(err)
			}
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return fmt.Errorf("listen on %s: %w", addr, err)
			}
			if token == "" {
				if err := checkLoopbackListener(addr, ln.Addr()); err != nil {
					ln.Close()
					return usageErr(err)
				}
			}
			srv := &http.Server{
				Handler:           h,
				ReadHeaderTimeout: 10 * time.Second,
				ReadTimeout:       30 * time.Second,
				WriteTimeout:      60 * time.Second,
				IdleTimeout:       2 * time.Minute,
				ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
			}
			mode := ""
			if readOnly {
				mode = ", read-only"
			}
			if token != "" {
				mode += ", token required"
			}
			fmt.Fprintf(a.stdout, "serving the console of table %s (%s) at http://%s/%s\n", i.table, i.target.dialect, ln.Addr(), mode)
			done := make(chan error, 1)
			go func() { done <- srv.Serve(ln) }()
			select {
			case err := <-done:
				return err
			case <-ctx.Done():
			}
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdown)
			defer cancel()
			err = srv.Shutdown(sctx)
			if serr := <-done; !errors.Is(serr, http.ErrServerClosed) {
				err = errors.Join(err, serr)
			}
			if err != nil {
				return err
			}
			fmt.Fprintln(a.stdout, "console stopped")
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&addr, "addr", "127.0.0.1:8080", "address to listen on; beyond the loopback interface it requires --token")
	fl.StringVar(&token, "token", "", "the token every request must present (default $INBOXMILL_TOKEN)")
	fl.BoolVar(&readOnly, "read-only", false, "hide the resolve and forget forms and refuse their requests")
	fl.StringVar(&actor, "actor", "", "the actor the audit trail names when a form leaves it empty (default \""+console.DefaultActor+"\")")
	fl.BoolVar(&debug, "debug", false, "log every request (paths only, never keys or bodies)")
	fl.StringSliceVar(&allowHosts, "allow-host", nil, "a further host name a console without a token answers (e.g. one an SSH tunnel forwards under); repeatable")
	fl.DurationVar(&shutdown, "shutdown-timeout", 10*time.Second, "how long requests under way may take to finish at shutdown")
	return cmd
}

// checkLoopbackListener refuses a listener without a token on anything
// but a loopback address: [console.CheckBind] trusts "localhost" by name,
// and a resolver may map it elsewhere.
func checkLoopbackListener(addr string, got net.Addr) error {
	if tcp, ok := got.(*net.TCPAddr); ok && tcp.IP.IsLoopback() {
		return nil
	}
	return fmt.Errorf("%w: %s is listening on %s, not a loopback address; pass a token (--token or INBOXMILL_TOKEN) or bind to 127.0.0.1",
		console.ErrTokenRequired, addr, got)
}
