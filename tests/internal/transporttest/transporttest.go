// Package transporttest runs the dedup middleware end to end behind a real
// Watermill transport: a producer whose retries put duplicates on the wire,
// consumer processes that SIGKILL themselves mid-stream, the broker's own
// redelivery, and a business table checked for exactly one effect per
// event, on PostgreSQL and on SQLite.
//
// A test package gives it a [Transport] and calls [Main] from its TestMain:
// the test binary re-executes itself as the consumer processes, so under
// -race the consumers are checked for data races too. It is for tests only.
package transporttest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.uber.org/goleak"

	"github.com/inboxmill/inboxmill/tests/testdb"
)

// Transport is what the scenarios need of one Watermill transport. Its
// methods run in the test process, except NewSubscriber, which consumer
// processes call too.
type Transport interface {
	// Name names the transport in test output.
	Name() string
	// Provision creates what s.Topic and s.Group need on the broker before
	// anything is published (a stream, a queue, a consumer group) and
	// removes it when t ends. It calls [Reach] first.
	Provision(t testing.TB, s Spec)
	// NewPublisher returns a publisher for the producer; the caller closes it.
	NewPublisher(t testing.TB) message.Publisher
	// NewSubscriber returns the subscriber one consumer reads s.Topic with,
	// as member s.Consumer of group s.Group, redelivering what a dead
	// member held after s.RedeliverAfter where the transport waits for that.
	NewSubscriber(s Spec) (message.Subscriber, error)
	// Backlog is how many messages of s.Topic the group has not acked, as
	// far as the broker tells (RabbitMQ does not count the unacked ones a
	// live consumer holds).
	Backlog(ctx context.Context, s Spec) (int, error)
}

// Reach fails t when nothing answers at addr and CI is set, and skips it
// otherwise, as package testdb does for the databases.
func Reach(t testing.TB, name, addr string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 3*time.Second)
	if err == nil {
		_ = conn.Close()
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("%s is unreachable at %s and CI is set, so this test fails instead of skipping: %v", name, addr, err)
	}
	t.Skipf("%s is unreachable at %s (set CI=1 to fail instead): %v", name, addr, err)
}

// Mode is the dedup mode a consumer runs.
type Mode string

const (
	// Transactional writes the effect in the middleware's transaction.
	Transactional Mode = "transactional"
	// Reserve writes the effect on a connection of its own, as a call to a
	// provider would be, under a reserve-mode lease; an attempt after the
	// first asks whether an earlier one made the effect.
	Reserve Mode = "reserve"
)

// Point is where a consumer process SIGKILLs itself.
type Point string

const (
	// AfterEffect: the effect is written (inside the open transaction, or
	// on its own connection in reserve mode) and not yet recorded.
	AfterEffect Point = "after-effect"
	// AfterCommit: the middleware committed and returned; the router has
	// not acked.
	AfterCommit Point = "after-commit"
)

// Spec is everything one consumer is told. Consumer processes receive it
// as JSON in their environment.
type Spec struct {
	// Consumer names the consumer: in its lines, its effect rows, its
	// lease owner and, where the broker has one, its consumer name.
	Consumer string
	// Topic is the stream, subject or queue; Group the consumer group.
	Topic, Group string
	// RedeliverAfter is how long the broker waits before it hands what a
	// consumer received and did not ack to another: JetStream's AckWait,
	// Redis' MaxIdleTime. RabbitMQ redelivers when the channel closes.
	RedeliverAfter time.Duration

	// DB is testdb.PostgresPGX or testdb.SQLite; DSN the PostgreSQL DSN or
	// the SQLite file.
	DB  testdb.Kind
	DSN string
	// Inbox and Effects are the inbox and business tables.
	Inbox, Effects string

	Mode Mode
	// Lease, Heartbeat and InFlightWait are the reserve mode's settings
	// (dedup.Reserve); zero takes the defaults, Heartbeat -1 disables it.
	Lease, Heartbeat, InFlightWait time.Duration

	// DieAt and DieAfter: SIGKILL the process the DieAfter-th time a
	// first attempt (Claim.Attempt 1) reaches DieAt. Only for consumer
	// processes.
	DieAt    Point
	DieAfter int

	// Slow makes the first attempt (Claim.Attempt 1) at these event IDs
	// sleep this long before the effect, ignoring its context, as a
	// provider call already sent does. Later attempts are quick: with
	// every attempt slower than its lease and no heartbeat, each one is
	// fenced by the next takeover and the intent never completes.
	Slow map[string]time.Duration
}

// HandlerName is the router handler's name, the records' operation.
const HandlerName = "record_effect"

const specEnv = "INBOXMILL_TRANSPORT_CONSUMER"

// Main is the TestMain of a transport's test package: re-executed as a
// consumer process it runs the consumer its environment describes until
// SIGTERM; otherwise it runs the tests and fails a passing binary that
// leaks goroutines.
//
// The leak check is testkit.MainWithLeakCheck's with more patience: some
// transport clients' goroutines end a moment after Close returns
// (watermill-redisstream's reader sleeps 500 ms after the read that Close
// interrupts), which is not a leak.
func Main(m *testing.M, tr Transport) {
	if raw := os.Getenv(specEnv); raw != "" {
		var s Spec
		if err := json.Unmarshal([]byte(raw), &s); err != nil {
			fmt.Fprintln(os.Stderr, "consumer: bad spec:", err)
			os.Exit(2)
		}
		os.Exit(processMain(tr, s))
	}
	code := m.Run()
	testdb.CloseShared()
	if code == 0 {
		var err error
		for range 6 {
			if err = goleak.Find(goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener")); err == nil {
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
