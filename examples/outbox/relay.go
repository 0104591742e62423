package main

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/inboxmill/inboxmill/examples/internal/kafkaex"
)

// crashPoint is where a forwarder process dies while forwarding a message.
type crashPoint int

const (
	noCrash crashPoint = iota
	// crashAfterPublish: Kafka has the message; the process dies before the
	// forwarder acks the outbox row.
	crashAfterPublish
	// crashAtAckCommit: the forwarder acked and the ack was written in the
	// outbox transaction, but the process dies before the commit.
	crashAtAckCommit
)

var errDead = errors.New("the forwarder process is dead")

// relay runs Watermill's Forwarder (outbox table -> Kafka) the way a
// deployment runs it: as a process that can die at any moment and is then
// replaced. A dead process sends nothing more to Kafka or the database, and
// its open outbox transaction rolls back, so the envelope it was forwarding
// stays unacked and its successor forwards it again: Kafka gets a copy.
type relay struct {
	db      *sql.DB
	brokers []string
	schema  wsql.SchemaAdapter
	offsets wsql.OffsetsAdapter
	topic   string // the outbox's watermill-sql topic
	logger  watermill.LoggerAdapter
	// crashAt says where the process forwarding the message with this
	// event_id dies; each event's crash happens once.
	crashAt func(eventID string) crashPoint

	mu        sync.Mutex
	fired     map[string]bool
	forwarded int // successful Kafka writes, copies included
	crashes   int

	stopOnce sync.Once
	stop     chan struct{}
	done     chan struct{}
}

func (r *relay) start() error {
	r.fired = map[string]bool{}
	r.stop, r.done = make(chan struct{}), make(chan struct{})
	p, err := r.spawn()
	if err != nil {
		return err
	}
	go r.supervise(p)
	return nil
}

// close stops the running process and the supervisor.
func (r *relay) close() {
	r.stopOnce.Do(func() { close(r.stop) })
	<-r.done
}

func (r *relay) stats() (forwarded, crashes int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.forwarded, r.crashes
}

// supervise replaces each process that dies. The successor starts before
// the dead process is cleaned up, as a restarted pod may while the database
// still holds the dead one's session: it waits on the outbox row lock until
// the dead transaction rolls back.
func (r *relay) supervise(p *process) {
	defer close(r.done)
	for {
		select {
		case <-r.stop:
			p.close()
			return
		case <-p.crashed:
		case <-p.exited:
		}
		next, err := r.spawn()
		p.close()
		for err != nil {
			select {
			case <-r.stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			next, err = r.spawn()
		}
		p = next
	}
}

// process is one forwarder process: its own Kafka producer, SQL subscriber
// and Forwarder.
type process struct {
	r      *relay
	kafka  *kafka.Publisher
	fwd    *forwarder.Forwarder
	runErr error
	exited chan struct{}

	dead        atomic.Bool
	dieAtCommit atomic.Bool
	crashOnce   sync.Once
	crashed     chan struct{}
}

func (r *relay) spawn() (*process, error) {
	p := &process{r: r, exited: make(chan struct{}), crashed: make(chan struct{})}
	var err error
	p.kafka, err = kafka.NewPublisher(kafka.PublisherConfig{
		Brokers: r.brokers,
		// Keyed by the order: every copy of a message lands on its partition.
		Marshaler: kafka.NewWithPartitioningMarshaler(func(_ string, msg *message.Message) (string, error) {
			return msg.Metadata.Get("causation_id"), nil
		}),
		OverwriteSaramaConfig: kafkaex.PublisherConfig(),
	}, r.logger)
	if err != nil {
		return nil, err
	}
	sub, err := wsql.NewSubscriber(processDB{wsql.BeginnerFromStdSQL(r.db), p}, wsql.SubscriberConfig{
		SchemaAdapter:  r.schema,
		OffsetsAdapter: r.offsets,
		PollInterval:   10 * time.Millisecond,
		ResendInterval: 10 * time.Millisecond,
		RetryInterval:  50 * time.Millisecond,
	}, r.logger)
	if err == nil {
		p.fwd, err = forwarder.NewForwarder(sub, p, r.logger, forwarder.Config{
			ForwarderTopic: r.topic,
			CloseTimeout:   10 * time.Second,
		})
	}
	if err != nil {
		_ = p.kafka.Close()
		return nil, err
	}
	go func() {
		p.runErr = p.fwd.Run(context.Background())
		close(p.exited)
	}()
	select {
	case <-p.fwd.Running():
		return p, nil
	case <-p.exited:
		_ = p.kafka.Close()
		return nil, p.runErr
	}
}

func (p *process) close() {
	_ = p.fwd.Close() // closes the subscriber; an unacked envelope stays in the outbox
	<-p.exited
	_ = p.kafka.Close()
}

func (p *process) die() {
	p.dead.Store(true)
	p.crashOnce.Do(func() { close(p.crashed) })
}

// Publish is the Forwarder's publisher: Kafka, and the process's death at
// the planned points.
func (p *process) Publish(topic string, msgs ...*message.Message) error {
	if p.dead.Load() {
		return errDead
	}
	if err := p.kafka.Publish(topic, msgs...); err != nil {
		return err // the forwarder nacks; the envelope is retried
	}
	switch p.r.forwardedOne(msgs) {
	case crashAfterPublish:
		p.die()
		return errDead
	case crashAtAckCommit:
		p.dieAtCommit.Store(true)
	}
	return nil
}

// Close is a no-op: the relay closes the process's producer.
func (p *process) Close() error { return nil }

func (r *relay) forwardedOne(msgs []*message.Message) crashPoint {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.forwarded += len(msgs)
	id := msgs[0].Metadata.Get("event_id") // the Forwarder publishes one message at a time
	point := r.crashAt(id)
	if point == noCrash || r.fired[id] {
		return noCrash
	}
	r.fired[id] = true
	r.crashes++
	return point
}

// processDB is the process's database connection: a dead process begins
// nothing, and its transactions roll back instead of committing.
type processDB struct {
	wsql.Beginner
	p *process
}

func (db processDB) BeginTx(ctx context.Context, opts *sql.TxOptions) (wsql.Tx, error) {
	if db.p.dead.Load() {
		return nil, errDead
	}
	tx, err := db.Beginner.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return processTx{tx, db.p}, nil
}

type processTx struct {
	wsql.Tx
	p *process
}

func (tx processTx) Commit() error {
	if tx.p.dead.Load() || tx.p.dieAtCommit.Load() {
		tx.p.die()
		_ = tx.Tx.Rollback()
		return errDead
	}
	return tx.Tx.Commit()
}
