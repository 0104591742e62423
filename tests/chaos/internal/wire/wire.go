// Package wire is what the chaos programs agree on: the modes, the points at
// which a consumer can be told to kill itself, the events on the topics, the
// lines a consumer prints for the driver, and the fake payment provider's
// HTTP API.
package wire

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/IBM/sarama"
)

// Modes: how a consumer receives events and makes their effect happen.
const (
	// KafkaTx: watermill-kafka consumer group, transactional mode; the effect
	// is a row written in the middleware's transaction.
	KafkaTx = "kafka-transactional"
	// KafkaReserve: watermill-kafka consumer group, reserve/complete mode;
	// the effect is a charge at the fake payment provider.
	KafkaReserve = "kafka-reserve"
	// SQLQueue: watermill-sql PostgreSQL queue, transactional mode joined to
	// the consuming transaction (watermillsql.Tx).
	SQLQueue = "sql-queue"
	// KafkaGroup: as KafkaTx, with group commit on (dedup.Group): the
	// deliveries a consumer has in flight (one per partition it is
	// assigned, and its topic has GroupPartitions) share one transaction.
	KafkaGroup = "kafka-group"
	// KafkaParallel: as KafkaTx, through the parallel consumer
	// (dedup/kafkaparallel): up to ParallelInFlight messages of a
	// partition at once, one account's events one after the other. Each
	// account's effects must come in its events' order.
	KafkaParallel = "kafka-parallel"
)

// Modes lists every mode, in the order the driver runs them.
var Modes = []string{KafkaTx, KafkaReserve, SQLQueue, KafkaGroup, KafkaParallel}

// ParallelInFlight is the kafka-parallel consumers'
// MaxInFlightPerPartition.
const ParallelInFlight = 16

// AccountOf is the account (the record key, the ordering key) of the
// kafka-parallel stream's event i, and its sequence number within the
// account: accounts take turns, so each has about one event in
// accounts.
func AccountOf(i, accounts int) (account string, seq int) {
	return fmt.Sprintf("acct-%04d", i%accounts), i / accounts
}

// GroupPartitions is the partition count of the KafkaGroup mode's topic.
// watermill-kafka's subscriber delivers one message per partition at a
// time, so a consumer has as many deliveries in flight as it has
// partitions: the other modes' eight spread over a group's consumers leave
// too few to form groups.
const GroupPartitions = 32

// Points at which a consumer can be told to kill itself (SIGKILL).
const (
	// BeforeClaim: a delivery arrived; the middleware has not claimed it.
	BeforeClaim = "before-claim"
	// AfterClaim: the handler starts; the claim is made (in the open
	// transaction, or as a committed reservation under a lease).
	AfterClaim = "after-claim"
	// MidHandler: the effect is done (the row written in the open
	// transaction, or the provider charged) and not yet recorded. In
	// KafkaGroup mode only a handler that runs after another member's in
	// the same group transaction counts: the kill comes inside a group
	// with uncommitted work of at least two deliveries.
	MidHandler = "mid-handler"
	// AfterCommit: the middleware committed (or recorded the outcome) and
	// returned; the router has not acked. For the SQL queue the consuming
	// transaction, which commits with the ack, is still open.
	AfterCommit = "after-commit"
)

// Points lists the kill points.
var Points = []string{BeforeClaim, AfterClaim, MidHandler, AfterCommit}

// ValidPoint reports whether p is one of Points.
func ValidPoint(p string) bool {
	for _, q := range Points {
		if p == q {
			return true
		}
	}
	return false
}

// Metadata of every event message (Kafka headers, watermill-sql metadata).
const (
	MetaEventID = "event_id"
	MetaTenant  = "tenant_id"
)

// Operation is the router handler's name, and so the inbox operation.
const Operation = "apply_event"

// Event is the payload of an event message. SentAt is re-stamped by a
// producer retry and left out of the fingerprint; Amount differs in a
// conflicting payload.
type Event struct {
	EventID string `json:"event_id"`
	Amount  int    `json:"amount"`
	SentAt  string `json:"sent_at"`
}

// Lines a consumer prints on stdout, one per line.
const (
	// LineReady: the router runs.
	LineReady = "READY"
	// LineDie is followed by the point: the consumer kills itself now.
	LineDie = "DIE"
	// LineStats is followed by Stats.String(): printed four times a second and at
	// a clean exit.
	LineStats = "STATS"
	// LineBye: the consumer stopped cleanly and exits 0.
	LineBye = "BYE"
)

// Stats is what a consumer's middleware did so far. Groups and Members
// are dedup.GroupStats' counts (zero without group commit): the group
// transactions begun and their members.
type Stats struct {
	Executed, Duplicates, Conflicts, InFlight, Retries, Pending, Takeovers uint64
	Groups, Members                                                        uint64
	// Peak is the most deliveries a consumer had in its middleware at
	// once; when summed, the highest of the processes'.
	Peak uint64
}

func (s Stats) String() string {
	return fmt.Sprintf("executed=%d duplicates=%d conflicts=%d in_flight=%d retries=%d pending=%d takeovers=%d groups=%d members=%d peak=%d",
		s.Executed, s.Duplicates, s.Conflicts, s.InFlight, s.Retries, s.Pending, s.Takeovers, s.Groups, s.Members, s.Peak)
}

// ParseStats reads what String wrote.
func ParseStats(s string) (Stats, error) {
	var st Stats
	_, err := fmt.Sscanf(s, "executed=%d duplicates=%d conflicts=%d in_flight=%d retries=%d pending=%d takeovers=%d groups=%d members=%d peak=%d",
		&st.Executed, &st.Duplicates, &st.Conflicts, &st.InFlight, &st.Retries, &st.Pending, &st.Takeovers,
		&st.Groups, &st.Members, &st.Peak)
	return st, err
}

// Add sums two Stats.
func (s Stats) Add(o Stats) Stats {
	return Stats{s.Executed + o.Executed, s.Duplicates + o.Duplicates, s.Conflicts + o.Conflicts,
		s.InFlight + o.InFlight, s.Retries + o.Retries, s.Pending + o.Pending, s.Takeovers + o.Takeovers,
		s.Groups + o.Groups, s.Members + o.Members, max(s.Peak, o.Peak)}
}

// MeanGroup is the mean number of members per group transaction (0 with
// none).
func (s Stats) MeanGroup() float64 {
	if s.Groups == 0 {
		return 0
	}
	return float64(s.Members) / float64(s.Groups)
}

// The fake payment provider's API.
const (
	// ChargesPath: POST creates a charge (body ChargeRequest), GET
	// ?idempotency_key= lists the charges made with that key.
	ChargesPath = "/charges"
	// HeaderIdempotencyKey carries dedup.Claim.IdempotencyKey.
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderDeadline is when the client gives up (Unix nanoseconds). The
	// provider refuses a request that reaches it later, without charging:
	// a request either charged before its client gave up or never will,
	// which is what makes "not found" a safe answer for the reconciler.
	HeaderDeadline = "X-Deadline"
)

// ChargeRequest is the body of a charge.
type ChargeRequest struct {
	EventID string `json:"event_id"`
	Amount  int    `json:"amount"`
}

// Charge is one charge the provider made.
type Charge struct {
	ID             string `json:"id"`
	IdempotencyKey string `json:"idempotency_key"`
	EventID        string `json:"event_id"`
	Amount         int    `json:"amount"`
	// CreatedAt is when the provider charged (Unix nanoseconds).
	CreatedAt int64 `json:"created_at"`
}

// KafkaVersion is the protocol version every chaos client speaks.
var KafkaVersion = sarama.V2_8_0_0

// SaramaConfig is the configuration the consumers and the driver use: a new
// group starts at the oldest offset, offsets are auto-committed every
// second, and a member that dies is evicted after a two-second session so
// that the group rebalances quickly. The rebalance timeout bounds how long a
// rebalance waits for members to rejoin, and with it how long a member
// stopping in the middle of one waits in JoinGroup: it must stay below the
// consumers' router close timeout. It must also exceed the longest a
// member needs to give up its partitions, which in reserve mode is a
// delivery waiting out a dead worker's lease (see package consumer).
func SaramaConfig(clientID string) *sarama.Config {
	cfg := sarama.NewConfig()
	cfg.Version = KafkaVersion
	cfg.ClientID = clientID
	cfg.Consumer.Return.Errors = true
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	cfg.Consumer.Offsets.AutoCommit.Enable = true
	cfg.Consumer.Offsets.AutoCommit.Interval = time.Second
	cfg.Consumer.Group.Session.Timeout = 2 * time.Second
	cfg.Consumer.Group.Heartbeat.Interval = 200 * time.Millisecond
	cfg.Consumer.Group.Rebalance.Timeout = 10 * time.Second
	cfg.Metadata.Retry.Backoff = 100 * time.Millisecond
	cfg.Net.DialTimeout = 5 * time.Second
	return cfg
}

// WithApplicationName returns dsn with PostgreSQL's application_name set,
// for URL DSNs (postgres://...) and key=value DSNs alike.
func WithApplicationName(dsn, name string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("parse DSN: %w", err)
		}
		q := u.Query()
		q.Set("application_name", name)
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	return strings.TrimSpace(dsn) + " application_name=" + name, nil
}

// Databases: where the inbox, the business table and the SQL queue live.
const (
	// Postgres: PostgreSQL through pgx; the driver cuts a consumer's
	// connections with pg_terminate_backend by application_name.
	Postgres = "postgres"
	// MySQL: MySQL or MariaDB through go-sql-driver/mysql; the driver cuts a
	// consumer's connections with KILL by the connection IDs the consumer
	// reports (LineConn), since MariaDB shows connection attributes only with
	// performance_schema, which is off by default.
	MySQL = "mysql"
)

// Databases lists every database, in the order the driver runs them.
var Databases = []string{Postgres, MySQL}

// ValidDatabase reports whether d is one of Databases.
func ValidDatabase(d string) bool {
	for _, e := range Databases {
		if d == e {
			return true
		}
	}
	return false
}

// SQLDriver is the database/sql driver name of a database.
func SQLDriver(db string) string {
	if db == MySQL {
		return "mysql"
	}
	return "pgx"
}

// LineConn is followed by the server's ID of a database connection the
// consumer just opened (MySQL: CONNECTION_ID()).
const LineConn = "CONN"

// History operations: what a consumer appends to its history file, one
// JSON object (HistoryOp) a line, and what the driver adds from the
// business table or the provider's ledger (OpEffect).
const (
	// OpClaim: the handler started for a delivery; the middleware claimed
	// the event (Call: the delivery reached the middleware).
	OpClaim = "claim"
	// OpCommit: the middleware returned success for a delivery whose
	// handler ran: it committed the effect (or recorded its outcome).
	OpCommit = "commit"
	// OpAck: the middleware returned success to the router, which acks the
	// message: the event's effect is done, with this payload.
	OpAck = "ack"
	// OpEffect: the effect itself (a row in the business table, a charge
	// at the provider), from the database or the ledger.
	OpEffect = "effect"
)

// HistoryOp is one operation of the history. Times are Unix nanoseconds.
// Open marks an operation whose completion the consumer cannot observe:
// in sql-queue mode the queue commits the consuming transaction, and with
// it the effect and the inbox record, only after the router's ack, so a
// commit or an ack there is only known to have started.
type HistoryOp struct {
	Op   string `json:"op"`
	Key  string `json:"key"`
	Hash string `json:"hash"`
	Call int64  `json:"call"`
	Ret  int64  `json:"ret"`
	Open bool   `json:"open,omitempty"`
	By   string `json:"by,omitempty"`
}

// PayloadHash identifies an event's business payload: what the
// middleware's fingerprint covers (sent_at is left out).
func PayloadHash(eventID string, amount int) string {
	h := sha256.Sum256(fmt.Appendf(nil, "%s\x00%d", eventID, amount))
	return hex.EncodeToString(h[:8])
}
