package inbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
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
	if len(ps) > MaxClaimMany {
		return nil, fmt.Errorf("inbox: claim many: %d claims, more than %d", len(ps), MaxClaimMany)
	}
	out := make([]ClaimResult, len(ps))
	now := s.now()
	// One entry per distinct valid key, in primary-key order.
	type claim struct {
		i int // index in ps of the key's first occurrence
		p params
	}
	claims := make([]*claim, 0, len(ps))
	for i, p := range ps {
		if p.Status == "" {
			p.Status = StatusCompleted
		}
		if p.Status != StatusCompleted && p.Status != StatusFailed {
			out[i].Err = fmt.Errorf("%w: a transactional claim inserts completed or failed, not %q", ErrIllegalTransition, p.Status)
			continue
		}
		if err := errors.Join(p.ID.Validate(), checkHash(p.PayloadHash)); err != nil {
			out[i].Err = err
			continue
		}
		c := &claim{i: i, p: params{
			id: p.ID, payloadHash: p.PayloadHash, status: p.Status,
			correlationID: storableCorrelationID(p.CorrelationID), errS: StorableText(p.Error, MaxErrorLen),
			createdAt: now, updatedAt: now, expiresAt: expiry(now, p.Retention),
		}}
		if err := s.place(ctx, q, &c.p, p.EventTime, now); err != nil {
			if !errors.Is(err, ErrBeyondRetention) {
				return nil, fmt.Errorf("inbox: claim many: %w", err)
			}
			r, err := s.beyondRetention(ctx, q, "claim many", p.ID, p.PayloadHash, err)
			if err != nil && !errors.Is(err, ErrBeyondRetention) && !errors.Is(err, ErrPayloadConflict) {
				return nil, err
			}
			r.Err = err
			out[i] = r
			continue
		}
		claims = append(claims, c)
	}
	slices.SortStableFunc(claims, func(a, b *claim) int { return compareID(a.p.id, b.p.id) })
	// Later occurrences of a key follow the first.
	followers := map[int]int{} // index in ps -> index in ps of the first occurrence
	uniq := claims[:0:0]
	for _, c := range claims {
		if n := len(uniq); n > 0 && uniq[n-1].p.id == c.p.id {
			followers[c.i] = uniq[n-1].i
			continue
		}
		uniq = append(uniq, c)
	}

	byID := make(map[ID]*claim, len(uniq))
	for _, c := range uniq {
		byID[c.p.id] = c
	}
	found := func(recs []*Record) {
		for _, rec := range recs {
			c := byID[rec.ID]
			if c == nil {
				continue
			}
			out[c.i].Record = rec
			if !rec.SamePayload(c.p.payloadHash) {
				out[c.i].Err = &ConflictError{ID: rec.ID, Existing: rec}
			}
		}
	}
	inserted := func(c *claim) {
		p := &c.p
		out[c.i] = ClaimResult{Claimed: true, Record: &Record{
			ID: p.id, PayloadHash: p.payloadHash, Status: p.status, Attempt: 1,
			CorrelationID: p.correlationID, Error: p.errS, CreatedAt: now, UpdatedAt: now, ExpiresAt: p.expiresAt,
		}}
	}

	todo := uniq
	if len(todo) > 0 && !s.insertMany(1).Returning {
		// Read first, insert what is missing, and count: rows affected
		// below the number inserted means that a concurrent transaction
		// claimed a key in between, and which one is unknown.
		recs, err := s.selectMany(ctx, q, paramsOf(todo, func(c *claim) *params { return &c.p }))
		if err != nil {
			return nil, err
		}
		found(recs)
		var missing []*claim
		for _, c := range todo {
			if out[c.i].Record == nil {
				missing = append(missing, c)
			}
		}
		if len(missing) > 0 {
			st := s.insertMany(len(missing))
			args, err := s.bindRows(st, paramsOf(missing, func(c *claim) *params { return &c.p }))
			if err != nil {
				return nil, err
			}
			res, err := q.ExecContext(ctx, st.SQL, args...)
			if err != nil {
				s.forgetPartitions()
				return nil, fmt.Errorf("inbox: claim many: %w", s.Classify(err))
			}
			n, err := res.RowsAffected()
			if err != nil {
				return nil, fmt.Errorf("inbox: claim many: rows affected: %w", s.Classify(err))
			}
			if n != int64(len(missing)) {
				return nil, fmt.Errorf("inbox: claim many: %d of %d keys were claimed concurrently: %w",
					int64(len(missing))-n, len(missing), ErrTransient)
			}
			for _, c := range missing {
				inserted(c)
			}
		}
		todo = nil
	}
	for try := 0; len(todo) > 0; try++ {
		if try == claimRetries {
			return nil, fmt.Errorf("inbox: claim many: records holding keys vanished %d times in a row: %w",
				claimRetries, ErrTransient)
		}
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
		for rows.Next() {
			var id ID
			if err := rows.Scan(&id.Scope, &id.Operation, &id.Key); err != nil {
				_ = rows.Close()
				return nil, fmt.Errorf("inbox: claim many: %w", s.Classify(err))
			}
			if c := byID[id]; c != nil {
				inserted(c)
			}
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			return nil, fmt.Errorf("inbox: claim many: %w", s.Classify(err))
		}
		var taken []*claim
		for _, c := range todo {
			if !out[c.i].Claimed {
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
		found(recs)
		// A record gone by the time it was read (purged, or rolled back)
		// leaves its key free: try again.
		todo = todo[:0]
		for _, c := range taken {
			if out[c.i].Record == nil {
				todo = append(todo, c)
			}
		}
	}
	for i, first := range followers {
		rec := out[first].Record
		switch {
		case out[first].Err != nil && rec == nil:
			out[i].Err = out[first].Err
		case rec != nil && !rec.SamePayload(ps[i].PayloadHash):
			out[i] = ClaimResult{Record: rec, Err: &ConflictError{ID: rec.ID, Existing: rec}}
		default:
			out[i] = ClaimResult{Record: rec}
		}
	}
	return out, nil
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
func (s *Store) insertMany(rows int) RowsQuery { return s.dialect.Queries(s.table).InsertMany(rows) }

// selectMany reads the records of ps's IDs.
func (s *Store) selectMany(ctx context.Context, q DBTX, ps []*params) ([]*Record, error) {
	st := s.dialect.Queries(s.table).SelectMany(len(ps))
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
