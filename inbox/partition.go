package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Partitioning is how a partitioned inbox table splits its records by
// time, so that a purge drops whole partitions instead of deleting rows
// one by one. Each record belongs to the bucket of its event's time
// ([ClaimParams.EventTime], or the claim's time when unset): the interval
// of Width that contains it. A bucket closes Retention after it ends; from
// then on a delivery of an event of that bucket is refused with
// [ErrBeyondRetention], and the partition is dropped by the next purge
// once every record in it is one a purge would delete anyway.
//
// A dialect supports partitioning by implementing [PartitionedDialect]
// (inbox/postgres.Partitioned).
type Partitioning struct {
	// Width is the time one partition covers, at least a minute and a
	// whole number of minutes. Defaults to DefaultPartitionWidth (a day).
	// It cannot change for an existing table.
	Width time.Duration
	// Ahead is how many buckets after the current one are kept created,
	// so that no claim waits for a partition to be made. Defaults to
	// DefaultPartitionsAhead.
	Ahead int
	// Retention is how long a bucket's records are kept after the bucket
	// ends. Defaults to DefaultPartitionRetention (7 days). Records
	// expire when their bucket closes, whatever the retention a claim asks
	// for.
	Retention time.Duration
}

// Defaults of [Partitioning].
const (
	DefaultPartitionWidth     = 24 * time.Hour
	DefaultPartitionsAhead    = 2
	DefaultPartitionRetention = 7 * 24 * time.Hour
	// MaxPartitions bounds the partitions a configuration keeps: every
	// claim probes each of them for its key.
	MaxPartitions = 100
	// PartitionGrace is how long after a bucket closes its partition is
	// still kept: claims are refused from the close on, and the grace
	// covers the clocks of processes that disagree by less.
	PartitionGrace = time.Minute
)

// WithDefaults returns p with its zero fields set to their defaults.
func (p Partitioning) WithDefaults() Partitioning {
	if p.Width == 0 {
		p.Width = DefaultPartitionWidth
	}
	if p.Ahead == 0 {
		p.Ahead = DefaultPartitionsAhead
	}
	if p.Retention == 0 {
		p.Retention = DefaultPartitionRetention
	}
	return p
}

// Validate reports what is wrong with p (after WithDefaults).
func (p Partitioning) Validate() error {
	var errs []error
	if p.Width < time.Minute || p.Width%time.Minute != 0 {
		errs = append(errs, fmt.Errorf("partition width %v is not a whole number of minutes", p.Width))
	}
	if p.Ahead < 1 {
		errs = append(errs, fmt.Errorf("partitions ahead %d is below 1", p.Ahead))
	}
	if p.Retention < 0 {
		errs = append(errs, fmt.Errorf("partition retention %v is negative", p.Retention))
	}
	if len(errs) == 0 {
		if n := p.kept(); n > MaxPartitions {
			errs = append(errs, fmt.Errorf("retention %v at width %v keeps %d partitions, more than %d: use wider partitions",
				p.Retention, p.Width, n, MaxPartitions))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return nil
}

// kept is how many partitions the table has in the steady state: the
// open past buckets, the current one and those ahead.
func (p Partitioning) kept() int64 {
	return int64((p.Retention+p.Width-1)/p.Width) + 1 + int64(p.Ahead) + 1
}

// Bucket returns the start of the bucket that holds t.
func (p Partitioning) Bucket(t time.Time) time.Time { return t.UTC().Truncate(p.Width) }

// Closes returns when the bucket starting at bucket closes: Retention
// after its end. Its records expire then.
func (p Partitioning) Closes(bucket time.Time) time.Time { return bucket.Add(p.Width + p.Retention) }

// PartitionedDialect is a [Dialect] whose table is partitioned by bucket.
// Its Queries' Insert and InsertMany bind [ArgBucket], and must keep one
// record per (scope, operation, key) across partitions: the database's
// unique key then includes the bucket, so a claim has to find the key in
// every partition, under a lock that a concurrent claim of the same key
// waits for, before it inserts.
type PartitionedDialect interface {
	Dialect
	// Partitioning is the table's layout (defaults applied).
	Partitioning() Partitioning
	// PartitionQueries returns the statements that manage table's
	// partitions.
	PartitionQueries(table string) PartitionQueries
}

// PartitionQueries are the statements of a partitioned table's
// life-cycle. Those that take a partition's name get one the store
// validated as a plain identifier.
type PartitionQueries interface {
	// ListPartitions lists the partitions of the table and the tables of
	// partitions detached but not dropped yet (named "<table>_p…").
	// Columns: name, lower bound, upper bound (NULL both for a detached
	// table), detached (boolean: not a partition any more, or its detach
	// is pending).
	ListPartitions() Query
	// AddPartition creates the partition ArgName for the bucket from
	// ArgBucket to ArgBucketEnd, unless a partition of that name exists.
	// Concurrent calls must not fail on each other. Args: those.
	AddPartition() Query
	// PartitionBlocked returns a row when the partition holds a record
	// that a purge before ArgBefore would keep: processing or pending,
	// kept forever, or expiring at or after ArgBefore. Args: before.
	PartitionBlocked(name string) Query
	// MarkDetaching marks a partition as the store's to drop, before it
	// is detached, so that ListPartitions finds its table if the drop is
	// interrupted (and leaves alone a table an operator detached).
	MarkDetaching(name string) Query
	// DetachPartition takes the partition out of the table, letting
	// claims go on while it waits for the transactions that may use it.
	// It runs outside any transaction.
	DetachPartition(name string) Query
	// FinishDetach completes a detach that was interrupted.
	FinishDetach(name string) Query
	// CountPartition counts the records of a detached partition (one
	// BIGINT column).
	CountPartition(name string) Query
	// DropPartition drops a detached partition's table.
	DropPartition(name string) Query
}

// Partition is one partition of a partitioned inbox table.
type Partition struct {
	Name string
	// From and To bound its bucket; zero for a detached table.
	From, To time.Time
	// Detached is set for a table whose detach is pending or done but
	// which is not dropped yet: the next purge drops it.
	Detached bool
}

// partitions is the store's view of its table's partitions.
type partitions struct {
	cfg Partitioning
	pq  PartitionQueries

	mu     sync.Mutex
	list   []Partition // attached, sorted by From
	loaded time.Time   // by the store's clock; zero: load before use

	ensuring atomic.Bool // a background EnsurePartitions is running
}

// partitionRefresh is how long the store trusts its list of partitions.
const partitionRefresh = time.Minute

func (s *Store) initPartitions() error {
	pd, ok := s.dialect.(PartitionedDialect)
	if !ok {
		return nil
	}
	cfg := pd.Partitioning().WithDefaults()
	if err := cfg.Validate(); err != nil {
		return err
	}
	pq := pd.PartitionQueries(s.table)
	if pq == nil {
		return fmt.Errorf("%w: dialect %s is partitioned but has no partition queries", ErrInvalidConfig, s.dialect.Name())
	}
	s.parts = &partitions{cfg: cfg, pq: pq}
	return nil
}

// Partitioning returns the table's partitioning, and false when the table
// is not partitioned.
func (s *Store) Partitioning() (Partitioning, bool) {
	if s.parts == nil {
		return Partitioning{}, false
	}
	return s.parts.cfg, true
}

// Partitions lists the table's partitions, oldest first, then the tables
// of partitions detached but not dropped yet. It returns nothing for a
// table that is not partitioned.
func (s *Store) Partitions(ctx context.Context) ([]Partition, error) {
	if s.parts == nil {
		return nil, nil
	}
	return s.partitionsVia(ctx, s.db)
}

func (s *Store) partitionsVia(ctx context.Context, q DBTX) ([]Partition, error) {
	rows, err := q.QueryContext(ctx, s.parts.pq.ListPartitions().SQL)
	if err != nil {
		return nil, fmt.Errorf("inbox: list partitions: %w", s.Classify(err))
	}
	defer rows.Close()
	var out []Partition
	for rows.Next() {
		var (
			p        Partition
			from, to sql.NullTime
		)
		if err := rows.Scan(&p.Name, &from, &to, &p.Detached); err != nil {
			return nil, fmt.Errorf("inbox: list partitions: %w", err)
		}
		p.From, p.To = from.Time.UTC(), to.Time.UTC()
		if !p.Detached && (!from.Valid || !to.Valid) {
			return nil, fmt.Errorf("inbox: list partitions: partition %s has no time bounds (not an inbox partition)", p.Name)
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("inbox: list partitions: %w", s.Classify(err))
	}
	slices.SortFunc(out, func(a, b Partition) int {
		if a.Detached != b.Detached {
			if a.Detached {
				return 1
			}
			return -1
		}
		return a.From.Compare(b.From)
	})
	return out, nil
}

// PartitionName is the name of the partition of the bucket starting at
// bucket.
func PartitionName(table string, bucket time.Time) string {
	return table + "_p" + bucket.UTC().Format("20060102T1504")
}

// EnsurePartitions creates the partitions a claim may need now that do
// not exist yet: every bucket that is not closed, from the oldest to
// Partitioning.Ahead buckets after the current one. It returns how many it
// created. The store calls it itself when a claim finds the current
// bucket's partition missing, the purge calls it on every run, and
// [Store.Migrate] after migrating; it is safe to call concurrently from
// several processes.
func (s *Store) EnsurePartitions(ctx context.Context) (int, error) {
	if s.parts == nil {
		return 0, nil
	}
	n, err := s.ensurePartitions(ctx, s.now())
	s.parts.mu.Lock()
	s.parts.loaded = time.Time{}
	s.parts.mu.Unlock()
	return n, err
}

func (s *Store) ensurePartitions(ctx context.Context, now time.Time) (int, error) {
	cfg := s.parts.cfg
	existing, err := s.Partitions(ctx)
	if err != nil {
		return 0, err
	}
	have := map[time.Time]bool{}
	for _, p := range existing {
		if !p.Detached {
			have[p.From] = true
		}
	}
	// The oldest bucket still open at now: it closes after now.
	first := cfg.Bucket(now.Add(-cfg.Retention - cfg.Width))
	for !cfg.Closes(first).After(now) {
		first = first.Add(cfg.Width)
	}
	last := cfg.Bucket(now).Add(time.Duration(cfg.Ahead) * cfg.Width)
	st := stmt(s.parts.pq.AddPartition())
	created := 0
	for b := first; !b.After(last); b = b.Add(cfg.Width) {
		if have[b] {
			continue
		}
		var made bool
		err := s.queryRow(ctx, s.db, st, &params{name: PartitionName(s.table, b), bucket: b, bucketEnd: b.Add(cfg.Width)}).Scan(&made)
		if err != nil {
			return created, fmt.Errorf("inbox: add partition %s: %w", PartitionName(s.table, b), s.Classify(err))
		}
		if made {
			created++
		}
	}
	return created, nil
}

// attached returns the attached partitions, from the store's list while
// it is fresh, else read through q (the caller's transaction, if any: a
// caller holding every connection of the pool must not wait for another).
// When the partitions ahead run short it has them created in the
// background; only a missing current bucket makes it create partitions
// before it returns.
func (s *Store) attached(ctx context.Context, q DBTX, now time.Time) ([]Partition, error) {
	ps := s.parts
	cur := ps.cfg.Bucket(now)
	ps.mu.Lock()
	list, loaded := ps.list, ps.loaded
	ps.mu.Unlock()
	if !loaded.IsZero() && now.Sub(loaded) < partitionRefresh && now.After(loaded) &&
		len(list) > 0 && !list[len(list)-1].From.Before(cur) {
		return list, nil
	}
	list, err := s.loadAttached(ctx, q)
	if err != nil {
		return nil, err
	}
	if len(list) == 0 || list[len(list)-1].From.Before(cur) {
		if _, err := s.ensurePartitions(ctx, now); err != nil {
			return nil, err
		}
		if list, err = s.loadAttached(ctx, s.db); err != nil {
			return nil, err
		}
	} else if list[len(list)-1].From.Before(cur.Add(time.Duration(ps.cfg.Ahead) * ps.cfg.Width)) {
		s.ensureInBackground()
	}
	ps.mu.Lock()
	ps.list, ps.loaded = list, now
	ps.mu.Unlock()
	return list, nil
}

// ensureInBackground runs EnsurePartitions in a goroutine unless one is
// running or the store is closed; Store.Close stops and waits for it.
func (s *Store) ensureInBackground() {
	ps := s.parts
	if !ps.ensuring.CompareAndSwap(false, true) {
		return
	}
	if !s.sync.start(func(ctx context.Context) {
		defer ps.ensuring.Store(false)
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		// A failure is retried by the next claim that finds the
		// partitions ahead short, and surfaces once the current bucket
		// has none.
		_, _ = s.EnsurePartitions(ctx)
	}) {
		ps.ensuring.Store(false)
	}
}

func (s *Store) loadAttached(ctx context.Context, q DBTX) ([]Partition, error) {
	all, err := s.partitionsVia(ctx, q)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(all, func(p Partition) bool { return p.Detached }), nil
}

// forgetPartitions makes the next claim read the partitions again, after a
// statement that may have failed on a partition that is gone.
func (s *Store) forgetPartitions() {
	if s.parts == nil {
		return
	}
	s.parts.mu.Lock()
	s.parts.loaded = time.Time{}
	s.parts.mu.Unlock()
}

// place decides where a record claimed at now for an event of eventTime
// goes in a partitioned table: its bucket, and the expiry that goes with
// it. An event whose bucket has closed is refused with ErrBeyondRetention.
// A bucket after the newest partition (an event time in the future) goes
// into the newest.
func (s *Store) place(ctx context.Context, q DBTX, p *params, eventTime, now time.Time) error {
	if s.parts == nil {
		return nil
	}
	cfg := s.parts.cfg
	if eventTime.IsZero() {
		eventTime = now
	}
	b := cfg.Bucket(eventTime)
	if !cfg.Closes(b).After(now) {
		return fmt.Errorf("%w: the event's time %s is in a bucket that closed at %s (retention %v)",
			ErrBeyondRetention, eventTime.UTC().Format(time.RFC3339), cfg.Closes(b).Format(time.RFC3339), cfg.Retention)
	}
	list, err := s.attached(ctx, q, now)
	if err != nil {
		return err
	}
	if newest := list[len(list)-1].From; b.After(newest) {
		b = newest
	}
	i, found := slices.BinarySearchFunc(list, b, func(p Partition, t time.Time) int { return p.From.Compare(t) })
	if !found || !list[i].To.Equal(b.Add(cfg.Width)) {
		s.forgetPartitions()
		return Transient(fmt.Errorf("inbox: no partition for the bucket at %s", b.Format(time.RFC3339)))
	}
	p.bucket = b
	return nil
}

// dropPartitions drops the partitions whose bucket closed before
// min(p.Before, now - PartitionGrace) and in which every record is one the
// batched purge would delete, and the tables of partitions detached
// earlier; r counts their records as deleted. A partition with a record
// to keep is left to the batched purge.
func (s *Store) dropPartitions(ctx context.Context, p PurgeParams, r *PurgeResult) error {
	if _, err := s.ensurePartitions(ctx, s.now()); err != nil {
		return err
	}
	defer s.forgetPartitions()
	cfg := s.parts.cfg
	limit := s.now().Add(-PartitionGrace)
	if p.Before.Before(limit) {
		limit = p.Before
	}
	all, err := s.Partitions(ctx)
	if err != nil {
		return err
	}
	for _, part := range all {
		if err := ctx.Err(); err != nil {
			return err
		}
		if !identifier.MatchString(part.Name) {
			return fmt.Errorf("inbox: purge: partition %q is not a plain identifier", part.Name)
		}
		if !part.Detached {
			if cfg.Closes(part.From).After(limit) {
				continue
			}
			err := s.queryRow(ctx, s.db, stmt(s.parts.pq.PartitionBlocked(part.Name)), &params{before: p.Before}).Scan(new(int))
			if err == nil {
				continue // a record to keep: the batched purge takes the rest
			}
			if !errors.Is(err, sql.ErrNoRows) {
				return fmt.Errorf("inbox: purge: check partition %s: %w", part.Name, s.Classify(err))
			}
			if _, err := s.db.ExecContext(ctx, s.parts.pq.MarkDetaching(part.Name).SQL); err != nil {
				return fmt.Errorf("inbox: purge: mark partition %s: %w", part.Name, s.Classify(err))
			}
			if _, err := s.db.ExecContext(ctx, s.parts.pq.DetachPartition(part.Name).SQL); err != nil {
				return fmt.Errorf("inbox: purge: detach partition %s: %w", part.Name, s.Classify(err))
			}
		} else {
			// An error here means the detach is not pending: it completed,
			// or the table was never attached. Dropping it is what is
			// left to do, and the drop fails with the real reason if the
			// table is still in use.
			_, _ = s.db.ExecContext(ctx, s.parts.pq.FinishDetach(part.Name).SQL)
		}
		n, err := s.dropDetached(ctx, part.Name, p, r)
		if err != nil {
			return err
		}
		r.Deleted += n
		r.Partitions++
		if p.Progress != nil {
			p.Progress(*r)
		}
	}
	return nil
}

// dropDetached counts and drops a detached partition's table in one
// transaction, with the purge's audit entry when p.Audit is set.
func (s *Store) dropDetached(ctx context.Context, name string, p PurgeParams, r *PurgeResult) (_ int64, err error) {
	tx, err := s.db.BeginTx(txContext(ctx), nil)
	if err != nil {
		return 0, fmt.Errorf("inbox: purge: begin: %w", s.Classify(err))
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	var n int64
	if err := tx.QueryRowContext(ctx, s.parts.pq.CountPartition(name).SQL).Scan(&n); err != nil {
		return 0, fmt.Errorf("inbox: purge: count partition %s: %w", name, s.Classify(err))
	}
	if _, err := tx.ExecContext(ctx, s.parts.pq.DropPartition(name).SQL); err != nil {
		return 0, fmt.Errorf("inbox: purge: drop partition %s: %w", name, s.Classify(err))
	}
	id := r.AuditID
	if p.Audit != nil {
		if id, err = s.auditPurge(ctx, tx, p, r, n); err != nil {
			return 0, err
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("inbox: purge: commit: %w", withCtxErr(ctx, s.Classify(err)))
	}
	r.AuditID = id
	return n, nil
}
