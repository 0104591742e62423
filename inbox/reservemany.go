package inbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
)

// ReserveMany is [Store.Reserve] for several intents in one statement
// (MySQL: a read and an insert in a short transaction of their own), for a
// caller that reserves the intents of many deliveries at once. Like
// Reserve it holds no transaction across the work: the reservations are
// committed when it returns. Results are in the order of ps.
//
// The keys are inserted in primary-key order, so that concurrent calls
// wait for each other rather than deadlock. What is wrong with one
// reservation is reported in its ReserveResult.Err and does not stop the
// others: an invalid key, hash, owner or lease, a *ConflictError
// (errors.Is ErrPayloadConflict), or ErrBeyondRetention. A key that
// appears more than once in ps is reserved by its first occurrence; a
// later one gets no Lease and the first one's Record, which is held by
// that lease (or a *ConflictError when its fingerprint differs). The
// error returned is the statement's, and then nothing was reserved —
// unless it is [IsRetryable] and the connection was lost, when, as with
// Reserve, some records may have been inserted under leases nobody
// holds, which expire.
func (s *Store) ReserveMany(ctx context.Context, ps []ReserveParams) ([]ReserveResult, error) {
	if len(ps) > MaxClaimMany {
		return nil, fmt.Errorf("inbox: reserve many: %d reservations, more than %d", len(ps), MaxClaimMany)
	}
	if err := s.checkLeaseRows(); err != nil {
		return nil, err
	}
	s.syncBeforeLease(ctx)
	cps := make([]ClaimParams, len(ps))
	leases := make([]leaseOf, len(ps))
	for i, p := range ps {
		cps[i] = ClaimParams{ID: p.ID, PayloadHash: p.PayloadHash, CorrelationID: p.CorrelationID,
			Retention: p.Retention, EventTime: p.EventTime}
		leases[i] = leaseOf{owner: p.Owner, lease: p.Lease}
	}
	var res []ClaimResult
	var err error
	if s.insertMany(1).Returning {
		res, err = s.reserveReturning(ctx, cps, leases)
	} else {
		res, err = s.reserveInTx(ctx, cps, leases)
	}
	if err != nil {
		return nil, err
	}
	out := make([]ReserveResult, len(ps))
	for i, r := range res {
		out[i] = ReserveResult{Record: r.Record, Err: r.Err}
		if r.Claimed {
			out[i].Lease = s.newLease(r.Record, ps[i].Retention)
		}
	}
	return out, nil
}

// checkLeaseRows refuses a dialect whose InsertMany does not store a
// lease: its reservations would be processing records anybody may take
// over at once.
func (s *Store) checkLeaseRows() error {
	st := s.insertMany(1)
	if !slices.Contains(st.RowArgs, ArgLeaseOwner) || !slices.Contains(st.RowArgs, ArgLeaseUntil) {
		return fmt.Errorf("%w: dialect %s's InsertMany does not bind the lease owner and until",
			ErrInvalidConfig, s.dialect.Name())
	}
	return nil
}

// reserveReturning reserves with the returning insert, in autocommit:
// the statement commits what it inserted, and the records of taken keys
// are read after it.
func (s *Store) reserveReturning(ctx context.Context, ps []ClaimParams, leases []leaseOf) ([]ClaimResult, error) {
	cs, err := s.prepareClaims(ctx, s.db, ps, leases)
	if err != nil {
		return nil, err
	}
	if len(cs.uniq) == 0 {
		return cs.results(), nil
	}
	return cs.claim(ctx, s.db, cs.uniq, nil, false)
}

// reserveInTx reserves where the insert returns nothing (MySQL): the read
// and the insert in one short transaction, which is rolled back and tried
// again when a concurrent call reserved one of the keys in between (rows
// affected cannot say which).
func (s *Store) reserveInTx(ctx context.Context, ps []ClaimParams, leases []leaseOf) ([]ClaimResult, error) {
	var err error
	for range claimRetries {
		var tx *Tx
		if tx, err = s.BeginTx(ctx, nil); err != nil {
			return nil, fmt.Errorf("inbox: reserve many: begin: %w", s.Classify(err))
		}
		var cs *claimSet
		if cs, err = s.prepareClaims(ctx, tx, ps, leases); err == nil && len(cs.uniq) > 0 {
			err = cs.readThenInsert(ctx, tx)
		}
		if err != nil {
			_ = tx.Rollback()
			if errors.Is(err, ErrTransient) {
				continue
			}
			return nil, err
		}
		if err = tx.Commit(); err != nil {
			return nil, fmt.Errorf("inbox: reserve many: commit: %w", s.Classify(err))
		}
		return cs.results(), nil
	}
	return nil, err
}

// Completion is one lease's outcome for [Store.CompleteMany].
type Completion struct {
	Lease   *Lease
	Outcome Outcome
}

// completeManyResult bounds the result a completion of CompleteMany
// takes into the shared statement; a larger one is completed on its own,
// where a refusal costs that completion alone.
const completeManyResult = 64 << 10

// CompleteMany is [Lease.Complete] for several leases of this store, in
// one statement (the dialect's FinishMany), each fenced by its own
// attempt: a lease that was taken over does not complete, and does not
// stop the others. It returns one error per completion, nil for those
// that completed; ErrLeaseLost and ErrIllegalTransition mean what they
// mean for Complete. A completion whose outcome is too large for the
// shared statement, or that the statement did not move, is completed on
// its own, as Complete does it (with its fallback for an outcome the
// database refuses); so is every one when the statement fails, and a
// record that shows the completion already (the statement committed
// although its answer was lost) counts as completed.
func (s *Store) CompleteMany(ctx context.Context, cs []Completion) []error {
	errs := make([]error, len(cs))
	type fin struct {
		i       int
		p       params
		dropped string
	}
	var batch []*fin
	var alone []int
	locked := make(map[*Lease]bool, len(cs))
	defer func() {
		for l := range locked {
			l.mu.Unlock()
		}
	}()
	for i, c := range cs {
		l := c.Lease
		switch {
		case l == nil || l.store != s:
			errs[i] = fmt.Errorf("%w: complete many: a lease of another store", ErrInvalidConfig)
			continue
		case locked[l]:
			errs[i] = fmt.Errorf("%w: complete many: the same lease twice", ErrIllegalTransition)
			continue
		}
		l.mu.Lock()
		locked[l] = true
		if err := l.check("complete", l.rec.Status); err != nil {
			errs[i] = err
			continue
		}
		if len(c.Outcome.Result) > completeManyResult || len(cs) == 1 {
			alone = append(alone, i)
			continue
		}
		f := &fin{i: i, p: params{id: l.rec.ID, attempt: l.rec.Attempt, fromStatus: l.rec.Status,
			status: StatusCompleted, result: c.Outcome.Result, resourceID: c.Outcome.ResourceID,
			externalRef: c.Outcome.ExternalRef, expiresAt: expiry(s.now(), l.retention), updatedAt: s.now()}}
		f.dropped = storableOutcome(&f.p, s.CheckResult(ctx, s.db, f.p.result))
		batch = append(batch, f)
	}
	if len(batch) == 1 {
		alone, batch = append(alone, batch[0].i), nil
	}
	var stmtErr error
	if len(batch) > 0 {
		slices.SortFunc(batch, func(a, b *fin) int { return compareID(a.p.id, b.p.id) })
		ps := make([]*params, len(batch))
		for j, f := range batch {
			ps[j] = &f.p
		}
		var moved map[ID]bool
		moved, stmtErr = s.finishMany(ctx, ps)
		for _, f := range batch {
			l := cs[f.i].Lease
			if moved[f.p.id] {
				l.ended, l.dropped = true, f.dropped
				continue
			}
			alone = append(alone, f.i)
		}
	}
	for _, i := range alone {
		l, o := cs[i].Lease, cs[i].Outcome
		err := l.transitionLocked(ctx, "complete", StatusCompleted, &params{
			result: o.Result, resourceID: o.ResourceID, externalRef: o.ExternalRef,
		}, true)
		if stmtErr != nil && errors.Is(err, ErrLeaseLost) && l.wrote(ctx, StatusCompleted) {
			err = nil
		}
		errs[i] = err
	}
	return errs
}

// finishMany runs the dialect's FinishMany for ps (sorted by ID) in
// autocommit and returns the IDs it moved.
func (s *Store) finishMany(ctx context.Context, ps []*params) (map[ID]bool, error) {
	st := s.rows.finish.get(len(ps), s.dq.FinishMany)
	args, err := s.bindRows(st, ps)
	if err != nil {
		return nil, err
	}
	moved := make(map[ID]bool, len(ps))
	if st.Returning {
		rows, err := s.db.QueryContext(ctx, st.SQL, args...)
		if err != nil {
			return nil, fmt.Errorf("inbox: complete many: %w", s.Classify(err))
		}
		for rows.Next() {
			var id ID
			if err := rows.Scan(&id.Scope, &id.Operation, &id.Key); err != nil {
				_ = rows.Close()
				return nil, fmt.Errorf("inbox: complete many: %w", s.Classify(err))
			}
			moved[id] = true
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			return nil, fmt.Errorf("inbox: complete many: %w", s.Classify(err))
		}
		return moved, nil
	}
	res, err := s.db.ExecContext(ctx, st.SQL, args...)
	if err != nil {
		return nil, fmt.Errorf("inbox: complete many: %w", s.Classify(err))
	}
	n, err := res.RowsAffected()
	if err != nil {
		return nil, fmt.Errorf("inbox: complete many: rows affected: %w", s.Classify(err))
	}
	if n == int64(len(ps)) {
		for _, p := range ps {
			moved[p.id] = true
		}
		return moved, nil
	}
	// Fewer moved: the records say which, by this statement's update
	// time at the attempt each completion held.
	recs, err := s.selectMany(ctx, s.db, ps)
	if err != nil {
		return nil, err
	}
	byID := make(map[ID]*params, len(ps))
	for _, p := range ps {
		byID[p.id] = p
	}
	for _, rec := range recs {
		if p := byID[rec.ID]; p != nil && rec.Attempt == p.attempt && rec.Status == p.status &&
			rec.UpdatedAt.Equal(p.updatedAt) && rec.LeaseOwner == "" {
			moved[rec.ID] = true
		}
	}
	return moved, nil
}
