package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/inboxmill/inboxmill/inbox"
)

// purgeMethod is one way of removing an inbox's expired records, measured
// by the purge scenario on a fresh inbox of its own. A method that needs
// another schema (a partitioned inbox, say) creates its table in create;
// the rows are seeded by the fixture all the same.
type purgeMethod struct {
	name string
	// dialects are those the method runs on.
	dialects []string
	// create makes the inbox table to purge; nil for the store's own
	// migrations (fixture.newStore).
	create func(ctx context.Context, f *fixture) (*inbox.Store, error)
	// remove removes the expired records and returns how many it removed.
	remove func(ctx context.Context, r *purgeRun) (int64, error)
	// after is the maintenance that removing leaves to do, measured on its
	// own; nil for none.
	after func(ctx context.Context, r *purgeRun) error
	// expiredBucket is seedRows.bucket of the expired rows.
	expiredBucket string
}

// purgeMethods are the methods the purge scenario measures, in order.
var purgeMethods = []purgeMethod{
	{name: "delete", dialects: []string{"pg", "mysql", "sqlite"}, remove: purgeDelete, after: afterDelete},
	// A partitioned inbox whose expired rows fill a closed partition: the
	// purge drops it. Nothing is left to vacuum.
	{name: "partition_drop", dialects: []string{"pg"}, create: createForDrop, remove: purgeDrop, expiredBucket: expiredBucket},
}

// purgeRun is one method's measurement at one size.
type purgeRun struct {
	b     *bench
	f     *fixture
	store *inbox.Store
	// expired rows are to be removed, live ones to stay.
	expired, live int64
	// undoBefore is InnoDB's history list length before the removal.
	undoBefore int64
}

// purgeResult is one PURGE line.
type purgeResult struct {
	dialect, method string
	keys            keyOrder
	batch           int
	rows            int64
	seconds         float64
	walBytes        int64
	afterSeconds    float64
	afterWALBytes   int64
}

func (r purgeResult) String() string {
	return fmt.Sprintf("PURGE dialect=%s method=%s rows=%d seconds=%.2f wal_bytes=%d after_seconds=%.2f after_wal_bytes=%d keys=%s batch=%d",
		r.dialect, r.method, r.rows, r.seconds, r.walBytes, r.afterSeconds, r.afterWALBytes, r.keys, r.batch)
}

// purge measures, on dialect d, each purge method at each size of
// opts.purge and key order of opts.keys: a fresh inbox with size expired
// finished records and a tenth as many live ones, the removal, and the
// maintenance after it, each timed and with the write-ahead log (InnoDB's
// redo log) written meanwhile. It then checks that exactly the expired
// records are gone.
func (b *bench) purge(ctx context.Context, d dialect) error {
	for _, size := range b.opts.purge {
		for _, keys := range b.opts.keys {
			for _, m := range purgeMethods {
				if !slices.Contains(m.dialects, d.name) {
					continue
				}
				r, err := b.purgeOnce(ctx, d, m, size, keys)
				if err != nil {
					return fmt.Errorf("%s of %d rows (%s keys): %w", m.name, size, keys, err)
				}
				b.purges = append(b.purges, r)
				fmt.Fprintln(b.out, r)
			}
		}
	}
	return nil
}

func (b *bench) purgeOnce(ctx context.Context, d dialect, m purgeMethod, size int64, keys keyOrder) (purgeResult, error) {
	res := purgeResult{dialect: d.name, method: m.name, keys: keys, batch: b.purgeBatch(), rows: size}
	f, err := b.newFixture(ctx, d, "purge", 2)
	if err != nil {
		return res, err
	}
	defer f.close()
	create := m.create
	if create == nil {
		create = func(ctx context.Context, f *fixture) (*inbox.Store, error) { return f.newStore(ctx) }
	}
	store, err := create(ctx, f)
	if err != nil {
		return res, err
	}
	r := &purgeRun{b: b, f: f, store: store, expired: size, live: max(size/10, 1)}

	// The rows: expired ones first (rows 1 … size, expiring in row order),
	// then the live ones; uuidv7 keys end a second before now.
	start := time.Now()
	undo, err := f.undoBacklog(ctx)
	if err != nil {
		return res, err
	}
	origin := time.Now().UnixMilli() - r.expired - r.live - 1000
	progress := func(done int64) {
		b.logf("purge %s (%s keys): %d of %d rows seeded after %v", d.name, keys, done, r.expired+r.live,
			time.Since(start).Round(time.Second))
	}
	err = f.bulkLoad(ctx, func(q execer, bulk bool) error {
		rows := seedRows{keys: keys, origin: origin, expiredTo: r.expired, bulk: bulk, expiredBucket: m.expiredBucket}
		return f.seed(ctx, q, store.Table(), 0, r.expired+r.live, rows, progress)
	})
	if err == nil {
		err = f.settle(ctx, store.Table(), undo)
	}
	if err != nil {
		return res, err
	}
	b.logf("purge %s (%s keys): %d expired and %d live rows seeded in %.1f s (%s)", d.name, keys, r.expired, r.live,
		time.Since(start).Seconds(), machineLoad())

	if r.undoBefore, err = f.undoBacklog(ctx); err != nil {
		return res, err
	}
	reads, err := f.poolReads(ctx)
	if err != nil {
		return res, err
	}
	mark, err := f.walPosition(ctx)
	if err != nil {
		return res, err
	}
	start = time.Now()
	deleted, err := m.remove(ctx, r)
	if err != nil {
		return res, err
	}
	res.seconds = time.Since(start).Seconds()
	if res.walBytes, err = f.walSince(ctx, mark); err != nil {
		return res, err
	}
	b.logf("purge %s (%s keys): %s removed %d rows in %.1f s (%s)", d.name, keys, m.name, deleted, res.seconds, machineLoad())
	if d.name == "mysql" {
		n, err := f.poolReads(ctx)
		if err != nil {
			return res, err
		}
		b.logf("purge %s (%s keys): %d InnoDB buffer pool reads from disk meanwhile (Innodb_buffer_pool_reads, server-wide), %.2f per row",
			d.name, keys, n-reads, float64(n-reads)/float64(max(deleted, 1)))
	}
	if m.after != nil {
		if mark, err = f.walPosition(ctx); err != nil {
			return res, err
		}
		start = time.Now()
		if err := m.after(ctx, r); err != nil {
			return res, err
		}
		res.afterSeconds = time.Since(start).Seconds()
		if res.afterWALBytes, err = f.walSince(ctx, mark); err != nil {
			return res, err
		}
	}

	// Exactly the expired records are gone.
	if deleted != r.expired {
		return res, fmt.Errorf("%s removed %d records, want %d", m.name, deleted, r.expired)
	}
	o, err := store.Overview(ctx)
	if err != nil {
		return res, err
	}
	if o.Total != r.live || o.AwaitingPurge != 0 {
		return res, fmt.Errorf("after %s the inbox holds %d records of which %d expired, want %d live ones",
			m.name, o.Total, o.AwaitingPurge, r.live)
	}
	return res, nil
}

// purgeBatch is the batch size the delete method passes to Store.Purge.
func (b *bench) purgeBatch() int {
	if b.opts.purgeBatch > 0 {
		return b.opts.purgeBatch
	}
	return inbox.DefaultPurgeBatchSize
}

// purgeDelete is the library's purge: Store.Purge's batched DELETE until
// nothing expired is left, with the batch size of --purge-batch (the
// library's default unless given) and no rest between batches (Pause -1),
// so that the time is the database's work alone. The default Pause rests
// as long as each batch took, which about doubles the wall time and adds
// no work.
func purgeDelete(ctx context.Context, r *purgeRun) (int64, error) {
	last := time.Now()
	res, err := r.store.Purge(ctx, inbox.PurgeParams{BatchSize: r.b.purgeBatch(), Pause: -1, Progress: func(p inbox.PurgeResult) {
		if time.Since(last) >= 30*time.Second {
			r.b.logf("purge %s: %d of %d deleted in %d batches (%s)", r.f.d.name, p.Deleted, r.expired, p.Batches, machineLoad())
			last = time.Now()
		}
	}})
	return res.Deleted, err
}

// afterDelete is what the deleted rows still cost. PostgreSQL: a VACUUM of
// the table, which removes the dead tuples from the heap and its indexes
// (autovacuum would do the same, later). MariaDB: InnoDB's purge threads
// remove the delete-marked records in the background, partly while the
// batches run; what is measured is the wait, after the last batch, until
// the history list is back to its length before the purge. SQLite: nothing
// (freed pages are reused; nothing else is owed).
func afterDelete(ctx context.Context, r *purgeRun) error {
	switch r.f.d.name {
	case "pg":
		return r.f.exec(ctx, "VACUUM "+r.store.Table())
	case "mysql":
		timeout := 30 * time.Minute
		if r.b.opts.smoke {
			timeout = time.Minute
		}
		settled, err := r.f.awaitUndoPurged(ctx, r.undoBefore, timeout)
		if err == nil && !settled {
			r.b.logf("purge %s: InnoDB's history list still above %d after %v; after_* counts up to then",
				r.f.d.name, r.undoBefore, timeout)
		}
		return err
	}
	return nil
}

// poolReads is MariaDB's Innodb_buffer_pool_reads: pages read from disk
// because the buffer pool did not hold them (server-wide). 0 elsewhere.
func (f *fixture) poolReads(ctx context.Context) (int64, error) {
	if f.d.name != "mysql" {
		return 0, nil
	}
	return f.globalStatus(ctx, "INNODB_BUFFER_POOL_READS")
}

// walMark is a position in the write-ahead log: PostgreSQL's LSN, or
// InnoDB's redo log sequence number.
type walMark struct {
	lsn string
	n   int64
}

// walPosition reads where the server's log is now. The log is the whole
// server's: other clients' writes meanwhile count too. SQLite: none.
func (f *fixture) walPosition(ctx context.Context) (walMark, error) {
	var m walMark
	var err error
	switch f.d.name {
	case "pg":
		err = f.db.QueryRowContext(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&m.lsn)
	case "mysql":
		m.n, err = f.globalStatus(ctx, "INNODB_LSN_CURRENT")
	}
	return m, err
}

// walSince returns the bytes of log written since m: on PostgreSQL
// pg_wal_lsn_diff, on MariaDB the growth of Innodb_lsn_current (the
// same figure as SHOW ENGINE INNODB STATUS's "Log sequence number"). 0 on
// SQLite, whose WAL file is reused after each checkpoint and so does not
// tell what was written.
func (f *fixture) walSince(ctx context.Context, m walMark) (int64, error) {
	switch f.d.name {
	case "pg":
		var s string
		if err := f.db.QueryRowContext(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::text", m.lsn).Scan(&s); err != nil {
			return 0, err
		}
		return strconv.ParseInt(s, 10, 64)
	case "mysql":
		n, err := f.globalStatus(ctx, "INNODB_LSN_CURRENT")
		return n - m.n, err
	}
	return 0, nil
}
