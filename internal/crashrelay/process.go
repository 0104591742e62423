package crashrelay

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
)

var errDead = errors.New("the forwarder process is dead")

// process is one forwarder process: its own Kafka producer, SQL subscriber
// and Forwarder.
type process struct {
	r      *Relay
	kafka  *kafka.Publisher
	fwd    *forwarder.Forwarder
	runErr error
	exited chan struct{}

	dead        atomic.Bool
	dieAtCommit atomic.Bool
	crashOnce   sync.Once
	crashed     chan struct{}
}

func (r *Relay) spawn() (*process, error) {
	p := &process{r: r, exited: make(chan struct{}), crashed: make(chan struct{})}
	var marshaler kafka.Marshaler = kafka.DefaultMarshaler{}
	if key := r.cfg.PartitionKey; key != "" {
		marshaler = kafka.NewWithPartitioningMarshaler(func(_ string, msg *message.Message) (string, error) {
			return msg.Metadata.Get(key), nil
		})
	}
	pubCfg := kafka.PublisherConfig{Brokers: r.cfg.Brokers, Marshaler: marshaler}
	if r.cfg.SaramaConfig != nil {
		pubCfg.OverwriteSaramaConfig = r.cfg.SaramaConfig()
	}
	var err error
	p.kafka, err = kafka.NewPublisher(pubCfg, r.cfg.Logger)
	if err != nil {
		return nil, err
	}
	sub, err := wsql.NewSubscriber(processDB{wsql.BeginnerFromStdSQL(r.db), p}, wsql.SubscriberConfig{
		SchemaAdapter:  r.cfg.Schema,
		OffsetsAdapter: r.cfg.Offsets,
		PollInterval:   10 * time.Millisecond,
		ResendInterval: 10 * time.Millisecond,
		RetryInterval:  r.cfg.RetryInterval,
	}, r.cfg.Logger)
	if err == nil {
		p.fwd, err = forwarder.NewForwarder(sub, p, r.cfg.Logger, forwarder.Config{
			ForwarderTopic: r.cfg.Topic,
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
	p.crashOnce.Do(func() {
		p.r.count(func(s *Stats) { s.Crashes++ })
		close(p.crashed)
	})
}

// Publish is the Forwarder's publisher: Kafka, and the process's death
// where CrashAt says.
func (p *process) Publish(topic string, msgs ...*message.Message) error {
	if p.dead.Load() {
		return errDead
	}
	crash := p.r.attempt(topic, msgs[0]) // the Forwarder publishes one message at a time
	if crash == BeforePublish {
		p.die()
		return errDead
	}
	if err := p.kafka.Publish(topic, msgs...); err != nil {
		return err // the Forwarder nacks; the subscriber offers the envelope again in the same transaction
	}
	p.r.count(func(s *Stats) { s.Writes += len(msgs) })
	switch crash {
	case AfterPublish:
		p.die()
		return errDead
	case AtAckCommit:
		p.dieAtCommit.Store(true)
	}
	return nil
}

// Close is a no-op: the relay closes the process's producer.
func (p *process) Close() error { return nil }

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
