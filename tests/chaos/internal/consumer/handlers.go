package consumer

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/dedup/pgxgroup"
	"github.com/inboxmill/inboxmill/handlers/reconcile"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/tests/chaos/internal/wire"
)

// effectHandler writes the event's effect, one row, in the middleware's
// transaction (its own, or the SQL queue's consuming one). The table has
// no unique constraint: an effect that happened twice is a second row.
func effectHandler(table, name string, placeholder func(int) string, ks *killSwitch) message.NoPublishHandlerFunc {
	insert := `INSERT INTO ` + table + ` (event_id, amount, consumer) VALUES (` + placeholder(1) + `, ` +
		placeholder(2) + `, ` + placeholder(3) + `)`
	return func(msg *message.Message) error {
		ctx := msg.Context()
		tx, ok := dedup.TxFromContext(ctx)
		if !ok {
			return errors.New("no transaction in the message's context")
		}
		var ev wire.Event
		if err := json.Unmarshal(msg.Payload, &ev); err != nil {
			return dedup.Permanent(err)
		}
		ranHandler(ctx, tx)
		ks.at(wire.AfterClaim)
		if _, err := tx.ExecContext(ctx, insert, ev.EventID, ev.Amount, name); err != nil {
			if ks.grouped != nil {
				ks.grouped.failed(tx)
			}
			return err
		}
		if ks.grouped == nil || ks.grouped.joins(tx) {
			ks.at(wire.MidHandler)
		}
		return nil
	}
}

// queuedEffectHandler is effectHandler for groups in pgx pipelines: the
// handler queues its effect, which goes to PostgreSQL with the group's
// COMMIT. It reads the group transaction's ID first (a statement run at
// once, after what the members before it queued), by which the kill
// switch tells the group transactions apart and asks PostgreSQL, when the
// delivery returns, whether the one it last ran in committed.
func queuedEffectHandler(table, name string, ks *killSwitch) message.NoPublishHandlerFunc {
	insert := `INSERT INTO ` + table + ` (event_id, amount, consumer) VALUES ($1, $2, $3)`
	return func(msg *message.Message) error {
		ctx := msg.Context()
		tx, ok := pgxgroup.FromContext(ctx)
		if !ok {
			return errors.New("no pipelined group transaction in the message's context")
		}
		var ev wire.Event
		if err := json.Unmarshal(msg.Payload, &ev); err != nil {
			return dedup.Permanent(err)
		}
		var xid int64
		if err := tx.QueryRowContext(ctx, "SELECT txid_current()").Scan(&xid); err != nil {
			return err
		}
		ranHandler(ctx, xid)
		ks.at(wire.AfterClaim)
		tx.Queue(insert, ev.EventID, ev.Amount, name)
		if ks.grouped.joins(xid) {
			ks.at(wire.MidHandler)
		}
		return nil
	}
}

// txStatus asks PostgreSQL whether the transaction with ID xid
// committed, on a connection of db's own.
func txStatus(db *sql.DB) func(xid int64) (committed bool, err error) {
	return func(xid int64) (bool, error) {
		var st sql.NullString
		if err := db.QueryRowContext(context.Background(), "SELECT txid_status($1)", xid).Scan(&st); err != nil {
			return false, err
		}
		return st.String == "committed", nil
	}
}

// groupTxs follows the group transactions of group commit mode. The
// handlers of a group run one after the other in its transaction, so a
// transaction seen before holds another member's uncommitted effect; and a
// handler that fails makes the middleware roll the group's transaction
// back and run the group again without it, so the effects written in that
// transaction are undone.
//
// A transaction is its *sql.Tx, or in pgx pipelines the server's
// transaction ID (int64), whose fate status reads from PostgreSQL.
type groupTxs struct {
	mu             sync.Mutex
	seen, rollback map[any]bool
	status         func(xid int64) (committed bool, err error)
}

// joins records a handler's run in tx and reports whether another
// member's handler ran in it before.
func (g *groupTxs) joins(tx any) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.seen[tx] {
		return true
	}
	if g.seen == nil || len(g.seen) >= 4096 {
		// Bounded: a transaction of long ago has ended.
		g.seen = map[any]bool{}
	}
	g.seen[tx] = true
	return false
}

// failed records that a handler failed in tx: the group rolls it back.
func (g *groupTxs) failed(tx any) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.rollback == nil || len(g.rollback) >= 4096 {
		g.rollback = map[any]bool{}
	}
	g.rollback[tx] = true
}

// rolledBack reports whether tx was rolled back because a handler failed
// (in pgx pipelines: whether it did not commit, which PostgreSQL knows;
// a statement queued by another member may have failed it).
func (g *groupTxs) rolledBack(tx any) bool {
	if xid, ok := tx.(int64); ok && g.status != nil {
		committed, err := g.status(xid)
		return err == nil && !committed
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return tx != nil && g.rollback[tx]
}

// chargeHandler charges the event's amount at the provider, which does not
// deduplicate: the handler sends the claim's idempotency key, asks first when
// an earlier attempt may have charged, and reports a timeout as uncertain.
func chargeHandler(api *providerClient, ks *killSwitch) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		ctx := msg.Context()
		claim, ok := dedup.ClaimFromContext(ctx)
		if !ok {
			return errors.New("no claim in the message's context")
		}
		var ev wire.Event
		if err := json.Unmarshal(msg.Payload, &ev); err != nil {
			return dedup.Permanent(err)
		}
		ranHandler(ctx, nil)
		ks.at(wire.AfterClaim)
		if claim.Attempt > 1 {
			// An earlier attempt may have charged before its worker died or
			// lost the answer.
			found, err := api.find(ctx, claim.IdempotencyKey)
			if err != nil {
				return err
			}
			if len(found) > 0 {
				return nil
			}
		}
		err := api.charge(ctx, claim.IdempotencyKey, ev)
		var ne net.Error
		switch {
		case err == nil:
		case errors.Is(err, errUnavailable):
			return err // refused before charging: released, retried at once
		case ctx.Err() != nil, errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
			// The request left and no answer came: it may have charged.
			// Never retry blindly; the reconciler asks the provider.
			return dedup.Uncertain(err, claim.IdempotencyKey)
		default:
			// The connection broke: released, and the next attempt (Attempt
			// > 1) asks the provider before charging.
			return err
		}
		ks.at(wire.MidHandler)
		return nil
	}
}

// resolver is the reconciler's question to the provider: was this intent
// charged? The provider refuses requests that arrive after their client gave
// up, so "no charge" after the handler recorded its outcome is final.
func resolver(api *providerClient) reconcile.ResolveFunc {
	return func(ctx context.Context, rec *inbox.Record) (reconcile.Resolution, error) {
		found, err := api.find(ctx, rec.IdempotencyKey())
		switch {
		case err != nil:
			return reconcile.Resolution{}, err
		case len(found) > 0:
			return reconcile.Resolution{Verdict: reconcile.Succeeded, ExternalRef: found[0].ID}, nil
		default:
			return reconcile.Resolution{Verdict: reconcile.NotHappened}, nil
		}
	}
}

// killSwitch kills the process the after-th time a delivery reaches point.
type killSwitch struct {
	point string
	after int64
	n     atomic.Int64
	out   *lines
	hist  *history
	// grouped is set in group commit mode: MidHandler counts only the
	// handlers that run after another member's in the same transaction,
	// and a delivery whose last handler run was rolled back with its
	// group's transaction records no commit. Nil: ungrouped.
	grouped *groupTxs
}

func (k *killSwitch) at(point string) {
	if k.point != point || k.n.Add(1) != k.after {
		return
	}
	k.out.println(wire.LineDie, point)
	self, err := os.FindProcess(os.Getpid())
	if err == nil {
		err = self.Kill() // SIGKILL: no deferred function, no goodbye to the broker or the database
	}
	if err != nil {
		panic(fmt.Sprintf("kill self at %s: %v", point, err))
	}
	for {
		time.Sleep(time.Hour)
	}
}

type deliveryKey struct{}

// txRef holds a transaction identity (*sql.Tx, an int64 ID, or nil) in an
// atomic.Value, which wants one concrete type.
type txRef struct{ tx any }

// lastTx is the transaction of the delivery's last handler run.
func (d *delivery) lastTxOf() any {
	r, _ := d.lastTx.Load().(txRef)
	return r.tx
}

// delivery is what the kill switch's middleware knows of one delivery.
type delivery struct {
	ran       atomic.Bool
	lastTx    atomic.Value // of the handler's last run: a txRef
	start     time.Time
	key, hash string
	hist      *history
}

// ranHandler notes that the handler ran for this delivery, in tx (nil in
// reserve mode), for AfterCommit, and records the claim in the history.
func ranHandler(ctx context.Context, tx any) {
	if d, ok := ctx.Value(deliveryKey{}).(*delivery); ok {
		d.ran.Store(true)
		d.lastTx.Store(txRef{tx})
		d.hist.record(wire.OpClaim, d.key, d.hash, d.start)
	}
}

// middleware sits between the poison queue and the dedup middleware: it
// holds the BeforeClaim point and, when the dedup middleware returns success
// for a delivery that ran the handler, the AfterCommit point. It records
// the delivery's commit (the handler ran and the middleware returned
// success) and ack (the middleware returned success: the router acks) in
// the history; a conflicting payload, refused by the middleware, is routed
// to the poison topic by the poison queue outside and never recorded as
// acked.
func (k *killSwitch) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		k.at(wire.BeforeClaim)
		ctx := msg.Context()
		d := &delivery{start: time.Now(), key: msg.Metadata.Get(wire.MetaEventID), hist: k.hist}
		var ev wire.Event
		if json.Unmarshal(msg.Payload, &ev) == nil {
			d.hash = wire.PayloadHash(ev.EventID, ev.Amount)
		}
		msg.SetContext(context.WithValue(ctx, deliveryKey{}, d))
		out, err := h(msg)
		msg.SetContext(ctx)
		if err == nil {
			// In a group, a member whose handler ran in a transaction
			// rolled back (another member failed) and that then found the
			// key committed by someone else returns success as a
			// duplicate: it committed nothing.
			if d.ran.Load() && (k.grouped == nil || !k.grouped.rolledBack(d.lastTxOf())) {
				k.hist.record(wire.OpCommit, d.key, d.hash, d.start)
				k.at(wire.AfterCommit)
			}
			k.hist.record(wire.OpAck, d.key, d.hash, d.start)
		}
		return out, err
	}
}

var errUnavailable = errors.New("provider refused the charge (nothing charged)")

// providerClient is the consumer's side of the fake payment provider.
type providerClient struct {
	base string
	http *http.Client
}

func newProviderClient(base string) *providerClient {
	return &providerClient{base: base, http: &http.Client{Transport: &http.Transport{
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     30 * time.Second,
	}}}
}

// charge asks for one charge and gives up after chargeTimeout; the deadline
// travels with the request so that the provider never charges after it.
func (c *providerClient) charge(ctx context.Context, key string, ev wire.Event) error {
	deadline := time.Now().Add(chargeTimeout)
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	body, err := json.Marshal(wire.ChargeRequest{EventID: ev.EventID, Amount: ev.Amount})
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+wire.ChargesPath, bytes.NewReader(body))
	if err != nil {
		return err
	}
	// Not replayable: with an Idempotency-Key header and a rewindable body,
	// net/http resends a POST by itself when a reused connection closes
	// before the answer, which a provider that does not deduplicate turns
	// into a second charge. Whether to try again is the middleware's call.
	req.GetBody = nil
	req.Header.Set(wire.HeaderIdempotencyKey, key)
	req.Header.Set(wire.HeaderDeadline, strconv.FormatInt(deadline.UnixNano(), 10))
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	switch {
	case err != nil:
		return err
	case resp.StatusCode == http.StatusOK:
		return nil
	case resp.StatusCode == http.StatusServiceUnavailable:
		return fmt.Errorf("%w: HTTP %d", errUnavailable, resp.StatusCode)
	default:
		return fmt.Errorf("charge: HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(b))
	}
}

// find lists the charges made with an idempotency key.
func (c *providerClient) find(ctx context.Context, key string) ([]wire.Charge, error) {
	ctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet,
		c.base+wire.ChargesPath+"?idempotency_key="+url.QueryEscape(key), nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("lookup: HTTP %d", resp.StatusCode)
	}
	var found []wire.Charge
	return found, json.NewDecoder(resp.Body).Decode(&found)
}
