package main

import (
	"context"
	"fmt"
	"time"

	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/postgres"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

// Layouts of the inbox table for the growth scenario (--layouts): the
// plain table, and PostgreSQL's partitioned one (postgres.Partitioned,
// day-wide partitions kept 7 days, the defaults).
const (
	layoutPlain       = "plain"
	layoutPartitioned = "partitioned"
)

// newPartitionedStore is newStore for a partitioned inbox, whose functions
// are dropped with it.
func (f *fixture) newPartitionedStore(ctx context.Context) (*inbox.Store, error) {
	store, err := inbox.NewStore(f.db, postgres.Partitioned(postgres.Partitions{}),
		inbox.Config{Table: testdb.UniqueName("bench_pinbox"), Prepare: f.prepare})
	if err != nil {
		return nil, err
	}
	f.cleanups = append(f.cleanups, func(ctx context.Context) { _ = store.MigrateDown(ctx, 0) })
	return store, store.Migrate(ctx)
}

// bucketSpread is the seed's bucket for a partitioned growth inbox: row n
// in one of the open day buckets, round robin, as a table filled over a
// week holds them: with the default 7-day retention the open buckets are
// today's and the seven before it.
const bucketSpread = "date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' - (n % 8) * interval '1 day'"

// createForDrop is the partition_drop method's inbox: a partitioned one
// with the partition of the day nine days ago, which closed a day ago
// (day-wide buckets kept 7 days), for the expired rows.
func createForDrop(ctx context.Context, f *fixture) (*inbox.Store, error) {
	store, err := f.newPartitionedStore(ctx)
	if err != nil {
		return nil, err
	}
	day := time.Now().UTC().Truncate(24 * time.Hour).Add(-9 * 24 * time.Hour)
	_, err = f.db.ExecContext(ctx, `SELECT "`+store.Table()+`_add_partition"($1, $2, $3)`,
		inbox.PartitionName(store.Table(), day), day, day.Add(24*time.Hour))
	return store, err
}

// expiredBucket puts the partition_drop method's expired rows into the
// day their seed created them (nine days ago), the closed partition.
const expiredBucket = "date_trunc('day', (now() - interval '9 days') AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'"

// purgeDrop is Store.Purge on the partitioned inbox: the closed
// partition dropped whole (detached concurrently, counted, dropped), then
// batches that find nothing expired left.
func purgeDrop(ctx context.Context, r *purgeRun) (int64, error) {
	res, err := r.store.Purge(ctx, inbox.PurgeParams{BatchSize: r.b.purgeBatch(), Pause: -1})
	if err == nil && res.Partitions != 1 {
		err = fmt.Errorf("purge dropped %d partitions, want 1", res.Partitions)
	}
	return res.Deleted, err
}
