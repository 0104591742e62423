package inbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"
)

// MaxClaimMany bounds the claims of one [Store.ClaimMany] call, which go
// into one statement.
const MaxClaimMany = 1000

// ClaimMany is [Store.Claim] for several intents in one statement (two on
// MySQL, which reads the records first), for a caller that does the work
// of many deliveries in one transaction q: a group commit. Results are in
// the order of ps.
//
// The keys are claimed in primary-key order (scope, operation, key),
// whatever the order of ps, so that two transactions claiming overlapping
// sets wait for each other rather than deadlock. A key another
// transaction holds makes the call wait until that transaction ends, as
// Claim does.
//
// What is wrong with one claim is reported in its ClaimResult.Err and
// does not stop the others: an invalid key or hash, or a *ConflictError
// (errors.Is ErrPayloadConflict) when the key is held with another
// payload fingerprint. A key that appears more than once in ps is claimed
// by its first occurrence; a later one is not Claimed and has the first
// one's Record (not committed yet: the caller must not treat it as a
// finished duplicate before it commits), or a *ConflictError when its
// fingerprint differs. The error returned is the statement's: the
// transaction should then be rolled back, and retried when it is
// [IsRetryable] — on MySQL also when a concurrent transaction claimed one
// of the keys between the read and the insert.
func (s *Store) ClaimMany(ctx context.Context, q DBTX, ps []ClaimParams) ([]ClaimResult, error) {
	cs, err := s.prepareClaims(ctx, q, ps, nil)
	if err != nil {
		return nil, err
	}
	if len(cs.uniq) == 0 {
		return cs.results(), nil
	}
	if !s.insertMany(1).Returning {
		if err := cs.readThenInsert(ctx, q); err != nil {
			return nil, err
		}
		return cs.results(), nil
	}
	return cs.claim(ctx, q, cs.uniq, nil, false)
}

// A ClaimPlan is [Store.ClaimMany] taken apart for a caller that sends
// the claim statement itself, together with other statements in one
// round trip (package dedup/pgxgroup sends it in a pipeline after BEGIN).
// The caller runs SQL with Args in its transaction, collects the ID of
// every row it returns, and passes them to Finish, which reads the
// records of the keys that were held already, through the same
// transaction, and returns what ClaimMany would have.
type ClaimPlan struct {
	// SQL and Args are the claim statement and its arguments; it returns
	// the scope, operation and key of every record it inserted. SQL is
	// empty when no key is left to claim: every claim was answered
	// already (invalid, or beyond retention), and Finish needs no rows.
	SQL  string
	Args []any

	cs *claimSet
}

// PlanClaimMany prepares what ClaimMany(ctx, q, ps) does, for a dialect
// whose statement over several records returns the keys it inserted
// (PostgreSQL, SQLite); on another it returns an error wrapping
// [ErrInvalidConfig]. q is used only on a partitioned inbox (to read the
// partition a claim goes to, or the record of a delivery older than
// every partition) and may be outside the caller's transaction.
func (s *Store) PlanClaimMany(ctx context.Context, q DBTX, ps []ClaimParams) (*ClaimPlan, error) {
	if !s.insertMany(1).Returning {
		return nil, fmt.Errorf("%w: dialect %s cannot claim several keys in one statement that returns them",
			ErrInvalidConfig, s.dialect.Name())
	}
	cs, err := s.prepareClaims(ctx, q, ps, nil)
	if err != nil {
		return nil, err
	}
	p := &ClaimPlan{cs: cs}
	if len(cs.uniq) > 0 {
		st := s.insertMany(len(cs.uniq))
		args, err := s.bindRows(st, paramsOf(cs.uniq, func(c *claim) *params { return &c.p }))
		if err != nil {
			return nil, err
		}
		p.SQL, p.Args = st.SQL, args
	}
	return p, nil
}

// Finish completes the claims after the caller ran the plan's statement
// in q's transaction: inserted are the IDs its rows returned, and
// stmtErr the statement's error (nil when it succeeded), which Finish
// classifies and returns as ClaimMany would. The keys that were held
// already are read through q (and claimed again through q if their
// records vanished meanwhile).
func (p *ClaimPlan) Finish(ctx context.Context, q DBTX, inserted []ID, stmtErr error) ([]ClaimResult, error) {
	cs := p.cs
	if p.SQL == "" {
		return cs.results(), nil
	}
	if stmtErr != nil {
		cs.s.forgetPartitions()
		return nil, fmt.Errorf("inbox: claim many: %w", cs.s.Classify(stmtErr))
	}
	return cs.claim(ctx, q, cs.uniq, inserted, true)
}

// claim is one distinct valid key of a ClaimMany.
type claim struct {
	i int // index in ps of the key's first occurrence
	p params
}

// claimSet is the state of one ClaimMany.
type claimSet struct {
	s   *Store
	ps  []ClaimParams
	out []ClaimResult
	now time.Time
	// uniq holds one claim per distinct valid key, in primary-key order.
	uniq []*claim
	byID map[ID]*claim
	// followers maps the index in ps of a later occurrence of a key to
	// that of its first occurrence.
	followers map[int]int
}

// leaseOf is the lease a reservation of ReserveMany inserts its
// processing record with.
type leaseOf struct {
	owner string
	lease time.Duration
}

// prepareClaims validates ps, places each claim (a partitioned inbox),
// and sorts and deduplicates the keys. With leases (ReserveMany: one per
// claim) the records are inserted processing under them; without, in
// the status each claim asks for.
func (s *Store) prepareClaims(ctx context.Context, q DBTX, ps []ClaimParams, leases []leaseOf) (*claimSet, error) {
	what := "claim many"
	if leases != nil {
		what = "reserve many"
	}
	if len(ps) > MaxClaimMany {
		return nil, fmt.Errorf("inbox: %s: %d claims, more than %d", what, len(ps), MaxClaimMany)
	}
	cs := &claimSet{s: s, ps: ps, out: make([]ClaimResult, len(ps)), now: s.now()}
	now := cs.now
	claims := make([]*claim, 0, len(ps))
	backing := make([]claim, 0, len(ps)) // the claims, in one allocation
	for i, p := range ps {
		var lease leaseOf
		if leases != nil {
			lease = leases[i]
			if err := checkLeaseParams(lease.owner, lease.lease); err != nil {
				cs.out[i].Err = err
				continue
			}
			p.Status = StatusProcessing
		}
		if p.Status == "" {
			p.Status = StatusCompleted
		}
		if leases == nil && p.Status != StatusCompleted && p.Status != StatusFailed {
			cs.out[i].Err = fmt.Errorf("%w: a transactional claim inserts completed or failed, not %q", ErrIllegalTransition, p.Status)
			continue
		}
		if err := errors.Join(p.ID.Validate(), checkHash(p.PayloadHash)); err != nil {
			cs.out[i].Err = err
			continue
		}
		backing = append(backing, claim{i: i, p: params{
			id: p.ID, payloadHash: p.PayloadHash, status: p.Status,
			correlationID: storableCorrelationID(p.CorrelationID), errS: StorableText(p.Error, MaxErrorLen),
			createdAt: now, updatedAt: now, expiresAt: expiry(now, p.Retention),
		}})
		c := &backing[len(backing)-1]
		if leases != nil {
			c.p.leaseOwner, c.p.leaseUntil = lease.owner, dbTime(now.Add(lease.lease))
		}
		if err := s.place(ctx, q, &c.p, p.EventTime, now); err != nil {
			if !errors.Is(err, ErrBeyondRetention) {
				return nil, fmt.Errorf("inbox: %s: %w", what, err)
			}
			r, err := s.beyondRetention(ctx, q, what, p.ID, p.PayloadHash, err)
			if err != nil && !errors.Is(err, ErrBeyondRetention) && !errors.Is(err, ErrPayloadConflict) {
				return nil, err
			}
			r.Err = err
			cs.out[i] = r
			continue
		}
		claims = append(claims, c)
	}
	slices.SortStableFunc(claims, func(a, b *claim) int { return compareID(a.p.id, b.p.id) })
	// Later occurrences of a key follow the first. uniq reuses claims'
	// array: it never gets ahead of the loop.
	cs.uniq = claims[:0]
	for _, c := range claims {
		if n := len(cs.uniq); n > 0 && cs.uniq[n-1].p.id == c.p.id {
			if cs.followers == nil {
				cs.followers = map[int]int{}
			}
			cs.followers[c.i] = cs.uniq[n-1].i
			continue
		}
		cs.uniq = append(cs.uniq, c)
	}
	return cs, nil
}

// lookup returns the claim of id, if ClaimMany claims it.
func (cs *claimSet) lookup(id ID) *claim {
	if len(cs.uniq) <= 4 {
		// A few keys: a scan costs less than building the map.
		for _, c := range cs.uniq {
			if c.p.id == id {
				return c
			}
		}
		return nil
	}
	if cs.byID == nil {
		cs.byID = make(map[ID]*claim, len(cs.uniq))
		for _, c := range cs.uniq {
			cs.byID[c.p.id] = c
		}
	}
	return cs.byID[id]
}

// found records the existing records read for held keys.
func (cs *claimSet) found(recs []*Record) {
	for _, rec := range recs {
		c := cs.lookup(rec.ID)
		if c == nil {
			continue
		}
		cs.out[c.i].Record = rec
		if !rec.SamePayload(c.p.payloadHash) {
			cs.out[c.i].Err = &ConflictError{ID: rec.ID, Existing: rec}
		}
	}
}

// inserted records that c's key was claimed.
func (cs *claimSet) inserted(c *claim) {
	p := &c.p
	cs.out[c.i] = ClaimResult{Claimed: true, Record: &Record{
		ID: p.id, PayloadHash: p.payloadHash, Status: p.status, Attempt: 1, LeaseOwner: p.leaseOwner,
		LeaseUntil: p.leaseUntil, CorrelationID: p.correlationID, Error: p.errS, CreatedAt: cs.now,
		UpdatedAt: cs.now, ExpiresAt: p.expiresAt,
	}}
}

// readThenInsert claims cs.uniq where the dialect's insert returns
// nothing (MySQL): read first, insert what is missing, and count. Rows
// affected below the number inserted means that a concurrent transaction
// claimed a key in between, and which one is unknown.
func (cs *claimSet) readThenInsert(ctx context.Context, q DBTX) error {
	s := cs.s
	recs, err := s.selectMany(ctx, q, paramsOf(cs.uniq, func(c *claim) *params { return &c.p }))
	if err != nil {
		return err
	}
	cs.found(recs)
	var missing []*claim
	for _, c := range cs.uniq {
		if cs.out[c.i].Record == nil {
			missing = append(missing, c)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	st := s.insertMany(len(missing))
	args, err := s.bindRows(st, paramsOf(missing, func(c *claim) *params { return &c.p }))
	if err != nil {
		return err
	}
	res, err := q.ExecContext(ctx, st.SQL, args...)
	if err != nil {
		s.forgetPartitions()
		return fmt.Errorf("inbox: claim many: %w", s.Classify(err))
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("inbox: claim many: rows affected: %w", s.Classify(err))
	}
	if n != int64(len(missing)) {
		return fmt.Errorf("inbox: claim many: %d of %d keys were claimed concurrently: %w",
			int64(len(missing))-n, len(missing), ErrTransient)
	}
	for _, c := range missing {
		cs.inserted(c)
	}
	return nil
}

// claim claims todo with the dialect's returning insert through q, reads
// the records of the keys that were held, and tries again those whose
// records vanished before they were read. When sent is set, the first
// insert was sent by the caller and returned inserted.
func (cs *claimSet) claim(ctx context.Context, q DBTX, todo []*claim, inserted []ID, sent bool) ([]ClaimResult, error) {
	s := cs.s
	for try := 0; len(todo) > 0; try++ {
		if try == claimRetries {
			return nil, fmt.Errorf("inbox: claim many: records holding keys vanished %d times in a row: %w",
				claimRetries, ErrTransient)
		}
		if try > 0 || !sent {
			var err error
			if inserted, err = cs.insertReturning(ctx, q, todo); err != nil {
				return nil, err
			}
		}
		for _, id := range inserted {
			if c := cs.lookup(id); c != nil {
				cs.inserted(c)
			}
		}
		var taken []*claim
		for _, c := range todo {
			if !cs.out[c.i].Claimed {
				taken = append(taken, c)
			}
		}
		if len(taken) == 0 {
			break
		}
		recs, err := s.selectMany(ctx, q, paramsOf(taken, func(c *claim) *params { return &c.p }))
		if err != nil {
			return nil, err
		}
		cs.found(recs)
		// A record gone by the time it was read (purged, or rolled back)
		// leaves its key free: try again.
		todo = todo[:0:0]
		for _, c := range taken {
			if cs.out[c.i].Record == nil {
				todo = append(todo, c)
			}
		}
	}
	return cs.results(), nil
}

// insertReturning runs the returning insert of todo through q and
// returns the IDs it inserted.
func (cs *claimSet) insertReturning(ctx context.Context, q DBTX, todo []*claim) ([]ID, error) {
	s := cs.s
	st := s.insertMany(len(todo))
	args, err := s.bindRows(st, paramsOf(todo, func(c *claim) *params { return &c.p }))
	if err != nil {
		return nil, err
	}
	rows, err := q.QueryContext(ctx, st.SQL, args...)
	if err != nil {
		s.forgetPartitions()
		return nil, fmt.Errorf("inbox: claim many: %w", s.Classify(err))
	}
	var ids []ID
	for rows.Next() {
		var id ID
		if err := rows.Scan(&id.Scope, &id.Operation, &id.Key); err != nil {
			_ = rows.Close()
			return nil, fmt.Errorf("inbox: claim many: %w", s.Classify(err))
		}
		ids = append(ids, id)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, fmt.Errorf("inbox: claim many: %w", s.Classify(err))
	}
	return ids, nil
}

// results fills in the later occurrences of keys and returns the
// results in the order of ps.
func (cs *claimSet) results() []ClaimResult {
	out := cs.out
	for i, first := range cs.followers {
		rec := out[first].Record
		switch {
		case out[first].Err != nil && rec == nil:
			out[i].Err = out[first].Err
		case rec != nil && !rec.SamePayload(cs.ps[i].PayloadHash):
			out[i] = ClaimResult{Record: rec, Err: &ConflictError{ID: rec.ID, Existing: rec}}
		default:
			out[i] = ClaimResult{Record: rec}
		}
	}
	return out
}

func compareID(a, b ID) int {
	return cmp.Or(cmp.Compare(a.Scope, b.Scope), cmp.Compare(a.Operation, b.Operation), cmp.Compare(a.Key, b.Key))
}

func paramsOf[T any](xs []T, f func(T) *params) []*params {
	out := make([]*params, len(xs))
	for i, x := range xs {
		out[i] = f(x)
	}
	return out
}

// insertMany and selectMany are the dialect's statements for rows
// records, rendered for the store's table.
func (s *Store) insertMany(rows int) RowsQuery { return s.rows.insert.get(rows, s.dq.InsertMany) }

// selectMany reads the records of ps's IDs.
func (s *Store) selectMany(ctx context.Context, q DBTX, ps []*params) ([]*Record, error) {
	st := s.rows.sel.get(len(ps), s.dq.SelectMany)
	args, err := s.bindRows(st, ps)
	if err != nil {
		return nil, err
	}
	rows, err := q.QueryContext(ctx, st.SQL, args...)
	if err != nil {
		return nil, fmt.Errorf("inbox: claim many: read existing records: %w", s.Classify(err))
	}
	defer func() { _ = rows.Close() }()
	var recs []*Record
	for rows.Next() {
		rec, err := scanRecord(rows)
		if err != nil {
			return nil, fmt.Errorf("inbox: claim many: read existing records: %w", s.Classify(err))
		}
		recs = append(recs, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("inbox: claim many: read existing records: %w", s.Classify(err))
	}
	return recs, nil
}

// bindRows binds st's RowArgs for every record of ps: packed into one
// value per arg by st.Array, or record after record.
func (s *Store) bindRows(st RowsQuery, ps []*params) ([]any, error) {
	for _, a := range st.RowArgs {
		if a <= 0 || a >= argEnd {
			return nil, fmt.Errorf("%w: dialect %s binds unknown %v in a statement over several records",
				ErrInvalidConfig, s.dialect.Name(), a)
		}
	}
	if st.Array != nil {
		args := make([]any, len(st.RowArgs))
		col := make([]any, len(ps))
		for j, a := range st.RowArgs {
			for i, p := range ps {
				col[i] = s.arg(a, p)
			}
			args[j] = st.Array(col)
		}
		return args, nil
	}
	args := make([]any, 0, len(ps)*len(st.RowArgs))
	for _, p := range ps {
		for _, a := range st.RowArgs {
			args = append(args, s.arg(a, p))
		}
	}
	return args, nil
}

// rowsQueryCache keeps the statements over several records by row count,
// up to rowsCached rows: their text is built once per count and store,
// not once per group.
type rowsQueryCache struct {
	insert, sel, finish rowsQueries
}

// rowsCached is the most rows whose statements are kept: a group's
// default maximum.
const rowsCached = 64

type rowsQueries [rowsCached + 1]atomic.Pointer[RowsQuery]

func (c *rowsQueries) get(rows int, build func(int) RowsQuery) RowsQuery {
	if rows < 0 || rows > rowsCached {
		return build(rows)
	}
	if q := c[rows].Load(); q != nil {
		return *q
	}
	q := build(rows)
	c[rows].Store(&q)
	return q
}
