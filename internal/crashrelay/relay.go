// Package crashrelay runs Watermill's Forwarder (a watermill-sql outbox
// table -> Kafka) the way a deployment runs it: as a process that can die at
// any moment and is then replaced. It kills the process where the caller
// says: before the Kafka write, after it, or at the commit of the outbox
// ack.
//
// A dead process sends nothing more to Kafka or the database, and its open
// outbox transaction rolls back instead of committing, so the envelope it
// was forwarding stays unacked and its successor forwards it again. A crash
// after the Kafka write therefore leaves a copy in Kafka: the at-least-once
// delivery a downstream inbox has to absorb.
//
// The outbox example and the outbox end-to-end test both run their
// forwarder this way:
//
//	r, err := crashrelay.Start(db, crashrelay.Config{
//		Topic: "outbox", Schema: schema, Offsets: offsets, Brokers: brokers,
//		CrashAt: func(_ string, _ *message.Message, attempt int) crashrelay.Crash {
//			if attempt == 0 {
//				return crashrelay.AfterPublish // every message reaches Kafka twice
//			}
//			return crashrelay.None
//		},
//	})
//	if err != nil {
//		return err
//	}
//	defer r.Close()
package crashrelay

import (
	"database/sql"
	"errors"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
)

// Crash is where a forwarder process dies during one attempt to forward a
// message.
type Crash int

const (
	// None: the attempt runs to its end.
	None Crash = iota
	// BeforePublish: the process dies holding the envelope, before the
	// Kafka write.
	BeforePublish
	// AfterPublish: Kafka has the message; the process dies before the
	// Forwarder acks the envelope.
	AfterPublish
	// AtAckCommit: the ack is written in the outbox transaction; the
	// process dies at its commit, which rolls back instead.
	AtAckCommit
)

// Config says what a Relay forwards and where its processes die.
type Config struct {
	// Topic is the outbox's watermill-sql topic, the ForwarderTopic its
	// forwarder.Publisher wraps messages for. Required.
	Topic string
	// Schema is the outbox table's schema adapter, the one its publisher
	// writes with. Required.
	Schema wsql.SchemaAdapter
	// Offsets is the outbox table's offsets adapter. Required.
	Offsets wsql.OffsetsAdapter
	// Brokers are the Kafka brokers the messages are forwarded to. Required.
	Brokers []string
	// PartitionKey names the metadata field whose value keys each Kafka
	// message, so that every copy of a message lands on one partition.
	// Defaults to "": no key (kafka.DefaultMarshaler).
	PartitionKey string
	// SaramaConfig returns the configuration of each new process's Kafka
	// producer, a sync producer's. Defaults to nil: watermill-kafka's
	// DefaultSaramaSyncPublisherConfig.
	SaramaConfig func() *sarama.Config
	// CrashAt says whether and where the process forwarding msg to the
	// Kafka topic dies on this attempt. attempt counts the attempts to
	// forward msg (by UUID) across all the Relay's processes, from 0; an
	// attempt a dead process refuses does not count. Calls come before the
	// attempt's Kafka write, so CrashAt may also arrange for that write to
	// fail. They are serialised under the Relay's lock: CrashAt must not
	// call the Relay. Defaults to nil: no process dies.
	CrashAt func(topic string, msg *message.Message, attempt int) Crash
	// RetryInterval is how long a process's outbox subscriber waits after a
	// database error, such as a dead process's failing transactions, before
	// it queries again. Defaults to 50ms.
	RetryInterval time.Duration
	// Logger receives the logs of the Forwarder, the outbox subscriber and
	// the Kafka producer. Defaults to nil: watermill.NopLogger{}.
	Logger watermill.LoggerAdapter
}

func (c Config) withDefaults() Config {
	if c.RetryInterval == 0 {
		c.RetryInterval = 50 * time.Millisecond
	}
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
	return c
}

func (c Config) validate() error {
	var errs []error
	if c.Topic == "" {
		errs = append(errs, errors.New("crashrelay: Topic is required"))
	}
	if c.Schema == nil {
		errs = append(errs, errors.New("crashrelay: Schema is required"))
	}
	if c.Offsets == nil {
		errs = append(errs, errors.New("crashrelay: Offsets is required"))
	}
	if len(c.Brokers) == 0 {
		errs = append(errs, errors.New("crashrelay: Brokers is required"))
	}
	if c.RetryInterval < 0 {
		errs = append(errs, errors.New("crashrelay: RetryInterval must not be negative"))
	}
	return errors.Join(errs...)
}

// Stats counts what a Relay has done so far.
type Stats struct {
	// Writes counts the messages written to Kafka, copies included.
	Writes int
	// Crashes counts the processes CrashAt killed.
	Crashes int
	// Restarts counts the processes started to replace one that died or
	// whose Forwarder stopped.
	Restarts int
}

// Relay is a supervised forwarder process, replaced whenever it dies. Each
// process has its own Kafka producer and outbox subscriber, which polls the
// outbox every 10ms.
type Relay struct {
	db  *sql.DB
	cfg Config

	mu       sync.Mutex
	attempts map[string]int // message UUID -> attempts so far
	stats    Stats

	stopOnce sync.Once
	stop     chan struct{}
	done     chan struct{}
}

// Start starts a forwarder process that moves cfg.Topic's outbox in db to
// Kafka, and a supervisor that replaces it whenever it dies. It returns
// once the first process runs; Close stops both.
func Start(db *sql.DB, cfg Config) (*Relay, error) {
	cfg = cfg.withDefaults()
	err := cfg.validate()
	if db == nil {
		err = errors.Join(errors.New("crashrelay: nil *sql.DB"), err)
	}
	if err != nil {
		return nil, err
	}
	r := &Relay{db: db, cfg: cfg, attempts: map[string]int{}, stop: make(chan struct{}), done: make(chan struct{})}
	p, err := r.spawn()
	if err != nil {
		return nil, err
	}
	go r.supervise(p)
	return r, nil
}

// Close stops the running process and the supervisor and waits for both.
// An envelope the process was forwarding stays unacked in the outbox. Close
// may be called more than once.
func (r *Relay) Close() {
	r.stopOnce.Do(func() { close(r.stop) })
	<-r.done
}

// Stats returns the counts so far.
func (r *Relay) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stats
}

// supervise replaces each process that dies. The successor starts before
// the dead one is cleaned up, as a restarted pod may while the database
// still holds the dead one's session: it waits on the envelope's row lock
// until the dead transaction rolls back.
func (r *Relay) supervise(p *process) {
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
		r.count(func(s *Stats) { s.Restarts++ })
		p = next
	}
}

// attempt counts an attempt to forward msg and returns its crash.
func (r *Relay) attempt(topic string, msg *message.Message) Crash {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.attempts[msg.UUID]
	r.attempts[msg.UUID] = n + 1
	if r.cfg.CrashAt == nil {
		return None
	}
	return r.cfg.CrashAt(topic, msg, n)
}

// count updates the stats under the lock.
func (r *Relay) count(f func(*Stats)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f(&r.stats)
}
