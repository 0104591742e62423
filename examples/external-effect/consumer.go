package main

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"sync"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/inboxmill/inboxmill/dedup"
)

// consumers is the pool of workers. A worker that crashes is replaced, as
// a supervisor would restart a process.
type consumers struct {
	q    *queue
	api  *client
	d    *dedup.Deduplicator
	seed int64

	// root is the pool's context; a replacement worker starts under it.
	root    context.Context
	wg      sync.WaitGroup
	crashes atomic.Int64
	fenced  atomic.Int64
	// zombies is closed at the end: crashed workers then "wake up".
	zombies chan struct{}
}

func (c *consumers) spawn() {
	wctx, crash := context.WithCancel(c.root)
	c.wg.Go(func() { c.work(wctx, crash) })
}

func (c *consumers) work(ctx context.Context, crash context.CancelFunc) {
	defer crash()
	for {
		del, err := c.q.receive(ctx)
		if err != nil {
			return
		}
		crashed := false
		handler := c.d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			return nil, c.charge(msg, func() {
				// The process dies right after the provider charged: no
				// outcome recorded, no ack, no heartbeat. A replacement
				// starts; this goroutine is frozen until the end.
				crashed = true
				c.crashes.Add(1)
				crash()
				c.spawn()
				<-c.zombies
			})
		})
		del.msg.SetContext(ctx)
		_, err = handler(del.msg)
		if crashed {
			// Back from the dead: the intent was taken over meanwhile, so
			// the late result must have been refused.
			if errors.Is(err, dedup.ErrLeaseLost) {
				c.fenced.Add(1)
			}
			return
		}
		switch {
		case err == nil:
			del.ack()
		case dedup.IsPoison(err):
			del.ack() // declined for good: recorded as failed; a real consumer would park it
		default:
			del.nack()
		}
	}
}

// charge is the business handler: one card charge per intent.
func (c *consumers) charge(msg *message.Message, crash func()) error {
	var req struct {
		Intent string `json:"intent"`
		Amount int    `json:"amount"`
	}
	if err := json.Unmarshal(msg.Payload, &req); err != nil {
		return dedup.Permanent(err)
	}
	claim, _ := dedup.ClaimFromContext(msg.Context())
	ctx := context.WithoutCancel(msg.Context())

	if claim.Attempt > 1 {
		// An earlier attempt may have charged before it died: ask first.
		found, err := c.api.find(ctx, claim.IdempotencyKey)
		if err != nil {
			return err
		}
		if len(found) > 0 && found[0].Status == "review" {
			return dedup.Uncertain(errInReview, found[0].ID)
		}
		if len(found) > 0 {
			return nil
		}
	}
	ch, err := c.api.charge(ctx, claim.IdempotencyKey, req.Intent, req.Amount)
	var ne net.Error
	switch {
	case errors.Is(err, errDeclined):
		return dedup.Permanent(err)
	case errors.Is(err, errInReview):
		// Neither charged nor refused yet: pending, under the provider's
		// reference, until the review ends.
		return dedup.Uncertain(err, ch.ID)
	case errors.As(err, &ne) && ne.Timeout():
		// The request left; whether it charged is unknown. Never retry
		// blindly: the reconciler will ask.
		return dedup.Uncertain(err, claim.IdempotencyKey)
	case err != nil:
		return err // unavailable: nothing charged, retry
	}
	if claim.Attempt == 1 && c.crashDice(req.Intent) {
		crash()
	}
	return nil
}

func (c *consumers) crashDice(intent string) bool {
	var n int
	for _, b := range []byte(intent) {
		n = n*31 + int(b)
	}
	return (n+int(c.seed))%9 == 0
}
