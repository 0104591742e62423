package main

import (
	"bytes"
	"context"
	"io"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }

// queue is a small at-least-once queue with a visibility timeout, the
// contract of SQS, Pub/Sub or a Kafka consumer group: a received message
// that is not acked in time (its consumer crashed) is delivered again, and
// a nacked one at once.
type queue struct {
	visibility time.Duration
	// maxReceives moves a message received this often without an ack to
	// the dead-letter list, as SQS's redrive policy or Pub/Sub's
	// max_delivery_attempts do, instead of delivering it again.
	maxReceives int

	mu       sync.Mutex
	nextID   int
	ready    []*item
	inflight map[int]*item
	acked    int
	dead     []*message.Message
}

type item struct {
	id       int
	msg      *message.Message
	token    int // which delivery may ack
	deadline time.Time
}

func newQueue(visibility time.Duration, maxReceives int) *queue {
	return &queue{visibility: visibility, maxReceives: maxReceives, inflight: map[int]*item{}}
}

func (q *queue) publish(msg *message.Message) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.nextID++
	q.ready = append(q.ready, &item{id: q.nextID, msg: msg})
}

// delivery is one receipt of a message.
type delivery struct {
	q     *queue
	it    *item
	token int
	msg   *message.Message
}

// receive waits for a message; expired in-flight ones come back first.
func (q *queue) receive(ctx context.Context) (*delivery, error) {
	for {
		q.mu.Lock()
		now := time.Now()
		for id, it := range q.inflight {
			if now.After(it.deadline) {
				delete(q.inflight, id)
				q.ready = append([]*item{it}, q.ready...)
			}
		}
		for len(q.ready) > 0 && q.ready[0].token >= q.maxReceives {
			q.dead = append(q.dead, q.ready[0].msg)
			q.ready = q.ready[1:]
		}
		if len(q.ready) > 0 {
			it := q.ready[0]
			q.ready = q.ready[1:]
			it.token++
			it.deadline = now.Add(q.visibility)
			q.inflight[it.id] = it
			d := &delivery{q: q, it: it, token: it.token, msg: it.msg.Copy()}
			q.mu.Unlock()
			return d, nil
		}
		q.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// ack removes the message, unless this receipt is stale (the message timed
// out and went to another consumer, whose ack counts).
func (d *delivery) ack() {
	q := d.q
	q.mu.Lock()
	defer q.mu.Unlock()
	if it, ok := q.inflight[d.it.id]; ok && it.token == d.token {
		delete(q.inflight, d.it.id)
		q.acked++
	}
}

func (d *delivery) nack() {
	q := d.q
	q.mu.Lock()
	defer q.mu.Unlock()
	if it, ok := q.inflight[d.it.id]; ok && it.token == d.token {
		delete(q.inflight, d.it.id)
		q.ready = append(q.ready, it)
	}
}

// idle reports whether every published message was acked or
// dead-lettered.
func (q *queue) idle() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.ready) == 0 && len(q.inflight) == 0
}

// deadLettered returns the messages moved to the dead-letter list.
func (q *queue) deadLettered() []*message.Message {
	q.mu.Lock()
	defer q.mu.Unlock()
	return append([]*message.Message(nil), q.dead...)
}
