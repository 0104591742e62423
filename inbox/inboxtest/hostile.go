package inboxtest

import (
	"encoding/base64"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox"
)

// runHostile gives the store's entry points what a careless or hostile
// caller would: keys odd but legal, keys no database can store, durations
// at the ends of time.Duration, nil and foreign handles, filters and
// cursors of garbage. Each gets a clear error wrapping one of the
// package's sentinels, or works; none panics, reaches the database with
// what it would refuse in its own words, or changes a record it refuses.
func runHostile(t *testing.T, h Harness) {
	t.Run("OddButLegalKeysRoundTrip", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		keys := []string{
			"😀-emoji", "\u202eevil-rtl", "e\u0301", "é", // combining and precomposed: two keys
			"'; DROP TABLE inbox; --", `%_\`, "NULL", " ", "\t\n\r", "\x01\x1f\x7f", "\u2028\u2029",
			"\ufeffbom", "\ufffd", "key\u00a0nbsp",
			strings.Repeat("😀", inbox.MaxKeyLen/4), // 252 bytes of 4-byte runes
			strings.Repeat("k", inbox.MaxKeyLen),
		}
		scopes := []string{"", " ", "tenant\u202e", strings.Repeat("s", inbox.MaxScopeLen)}
		var ids []inbox.ID
		for _, scope := range scopes {
			for _, key := range keys {
				rid := inbox.ID{Scope: scope, Operation: "op\u00e9", Key: key}
				require.NoError(t, rid.Validate(), "%q", key)
				res, err := b.store.Claim(b.ctx, b.db, inbox.ClaimParams{ID: rid, PayloadHash: hash(key)})
				require.NoError(t, err, "%q/%q", scope, key)
				require.True(t, res.Claimed, "%q/%q: a distinct key of its own", scope, key)
				ids = append(ids, rid)
			}
		}
		require.Equal(t, len(ids), b.records(t), "no two keys folded into one")
		for _, rid := range ids {
			rec := b.get(t, rid)
			require.Equal(t, rid, rec.ID, "read back byte for byte")
			found, err := b.store.FindByDigest(b.ctx, rid.Digest(), rid.Operation)
			require.NoError(t, err, "%q", rid.Key)
			require.Equal(t, rid, found.ID)
		}
		// Listed, paged by a cursor through every one of them.
		var listed []inbox.ID
		f := inbox.Filter{Limit: 7}
		for {
			page, err := b.store.List(b.ctx, f)
			require.NoError(t, err)
			for _, r := range page.Records {
				listed = append(listed, r.ID)
			}
			if page.Next == "" {
				break
			}
			f.After = page.Next
		}
		require.ElementsMatch(t, ids, listed)
		for _, rid := range ids {
			require.NoError(t, b.store.Delete(b.ctx, b.db, rid), "%q", rid.Key)
		}
		require.Zero(t, b.records(t))
	})

	t.Run("UnstorableIDsAreRefusedBeforeTheDatabase", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		held := id("op", "held")
		_, err := b.store.Claim(b.ctx, b.db, inbox.ClaimParams{ID: held, PayloadHash: hash("x")})
		require.NoError(t, err)
		actor := inbox.Actor{Name: "ops", Reason: "r"}
		for name, rid := range map[string]inbox.ID{
			"invalid UTF-8 key":       {Operation: "op", Key: "a\xffb"},
			"truncated rune key":      {Operation: "op", Key: "a\xe2\x82"},
			"NUL in key":              {Operation: "op", Key: "held\x00"},
			"NUL in scope":            {Scope: "\x00", Operation: "op", Key: "held"},
			"invalid UTF-8 operation": {Operation: "op\xc0", Key: "held"},
			"key one byte too long":   {Operation: "op", Key: strings.Repeat("k", inbox.MaxKeyLen+1)},
			"a megabyte key":          {Operation: "op", Key: strings.Repeat("k", 1<<20)},
			"empty key":               {Operation: "op", Key: ""},
			"empty operation":         {Key: "held"},
		} {
			_, err := b.store.Get(b.ctx, b.db, rid)
			require.ErrorIs(t, err, inbox.ErrInvalidKey, "Get: %s", name)
			require.ErrorIs(t, b.store.Delete(b.ctx, b.db, rid), inbox.ErrInvalidKey, "Delete: %s", name)
			_, err = b.store.Claim(b.ctx, b.db, inbox.ClaimParams{ID: rid, PayloadHash: hash("x")})
			require.ErrorIs(t, err, inbox.ErrInvalidKey, "Claim: %s", name)
			_, err = b.store.Reserve(b.ctx, inbox.ReserveParams{ID: rid, PayloadHash: hash("x"), Owner: "w", Lease: time.Minute})
			require.ErrorIs(t, err, inbox.ErrInvalidKey, "Reserve: %s", name)
			_, _, err = b.store.Resolve(b.ctx, inbox.ResolveParams{ID: rid, To: inbox.StatusFailed, Actor: actor})
			require.ErrorIs(t, err, inbox.ErrInvalidParams, "Resolve: %s", name)
			_, err = b.store.Forget(b.ctx, inbox.ForgetParams{ID: rid, Actor: actor})
			require.ErrorIs(t, err, inbox.ErrInvalidParams, "Forget: %s", name)
			res, err := b.store.ClaimMany(b.ctx, b.db, []inbox.ClaimParams{{ID: rid, PayloadHash: hash("x")}})
			require.NoError(t, err, "ClaimMany: %s", name)
			require.ErrorIs(t, res[0].Err, inbox.ErrInvalidKey, "ClaimMany: %s", name)
		}
		for _, op := range []string{"op\xff", "op\x00", strings.Repeat("o", inbox.MaxOperationLen+1)} {
			_, err := b.store.OldestCreated(b.ctx, op)
			require.ErrorIs(t, err, inbox.ErrInvalidKey, "%q", op)
			_, err = b.store.FindByDigest(b.ctx, held.Digest(), op)
			require.ErrorIs(t, err, inbox.ErrInvalidKey, "%q", op)
			_, err = b.store.List(b.ctx, inbox.Filter{Operation: op})
			require.ErrorIs(t, err, inbox.ErrInvalidParams, "%q", op)
		}
		for _, digest := range []string{"", "0123456789ABCDEF", "0123456789abcde", "0123456789abcdef0", "0123456789abcdeg", "é123456789abcde"} {
			_, err := b.store.FindByDigest(b.ctx, digest, "")
			require.ErrorIs(t, err, inbox.ErrInvalidKey, "%q", digest)
		}
		require.Equal(t, 1, b.records(t))
		require.Equal(t, inbox.StatusCompleted, b.get(t, held).Status)
	})

	t.Run("DurationsAtTheEndsOfTime", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		now := b.store.Now()
		// The longest retention and lease a time.Duration holds: about
		// 292 years, which every database's time column keeps.
		long := id("op", "long")
		_, err := b.store.Claim(b.ctx, b.db, inbox.ClaimParams{ID: long, PayloadHash: hash("x"), Retention: math.MaxInt64})
		require.NoError(t, err)
		require.WithinDuration(t, now.Add(math.MaxInt64), b.get(t, long).ExpiresAt, time.Minute)
		// Negative and zero retentions keep a record for ever, as
		// documented; a nanosecond is a retention like any other.
		for name, r := range map[string]time.Duration{"forever": -1, "zero": 0, "very negative": math.MinInt64} {
			rid := id("op", name)
			_, err := b.store.Claim(b.ctx, b.db, inbox.ClaimParams{ID: rid, PayloadHash: hash("x"), Retention: r})
			require.NoError(t, err, name)
			require.True(t, b.get(t, rid).ExpiresAt.IsZero(), name)
		}
		res, err := b.store.Reserve(b.ctx, inbox.ReserveParams{ID: id("op", "leased"), PayloadHash: hash("x"), Owner: "w",
			Lease: math.MaxInt64, Retention: math.MaxInt64})
		require.NoError(t, err)
		require.False(t, b.get(t, id("op", "leased")).LeaseExpired(b.store.Now()))
		require.NoError(t, res.Lease.Extend(b.ctx, math.MaxInt64))
		for _, d := range []time.Duration{0, -1, math.MinInt64} {
			require.ErrorIs(t, res.Lease.Extend(b.ctx, d), inbox.ErrInvalidConfig, "%v", d)
			_, err := b.store.Reserve(b.ctx, inbox.ReserveParams{ID: id("op", "r"), PayloadHash: hash("x"), Owner: "w", Lease: d})
			require.ErrorIs(t, err, inbox.ErrInvalidConfig, "%v", d)
		}
		require.NoError(t, res.Lease.Complete(b.ctx, inbox.Outcome{}))
		require.WithinDuration(t, b.store.Now().Add(math.MaxInt64), b.get(t, id("op", "leased")).ExpiresAt, time.Minute)

		// A purge before any time deletes nothing; the default one what
		// has expired, in batches as large as an int32; one "before" the
		// far future what will have expired by then: the records kept
		// for 292 years too, and not those kept for ever.
		b.seed(t, "old", 3, inbox.StatusCompleted, now.Add(-time.Hour))
		for _, before := range []time.Time{time.Date(1, 1, 1, 0, 0, 0, 1, time.UTC), time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC)} {
			r, err := b.store.Purge(b.ctx, inbox.PurgeParams{Before: before})
			require.NoError(t, err, "%v", before)
			require.Zero(t, r.Deleted, "%v", before)
		}
		r, err := b.store.Purge(b.ctx, inbox.PurgeParams{BatchSize: math.MaxInt32, MaxBatches: -1, Pause: math.MinInt64})
		require.NoError(t, err)
		require.EqualValues(t, 3, r.Deleted)
		require.Equal(t, 5, b.records(t), "only the expired went")
		for i, before := range []time.Time{time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC), time.Date(20000, 1, 1, 0, 0, 0, 0, time.UTC)} {
			r, err := b.store.Purge(b.ctx, inbox.PurgeParams{Before: before})
			require.NoError(t, err, "%v", before)
			require.EqualValues(t, 2*(1-i), r.Deleted, "%v: the records kept for 292 years, by the first", before)
			require.Equal(t, 3, b.records(t), "%v: the records kept for ever stay", before)
		}
		for _, limit := range []int{-1, math.MinInt} {
			_, err := b.store.ListPending(b.ctx, limit)
			require.ErrorIs(t, err, inbox.ErrInvalidParams)
			_, err = b.store.ListStale(b.ctx, now, limit)
			require.ErrorIs(t, err, inbox.ErrInvalidParams)
		}
		for _, before := range []time.Time{time.Date(-5, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(20000, 1, 1, 0, 0, 0, 0, time.UTC)} {
			_, err := b.store.ListStale(b.ctx, before, 10)
			require.NoError(t, err, "%v", before)
		}
	})

	t.Run("NilAndForeignHandles", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		_, err := b.store.TakeOver(b.ctx, nil, inbox.TakeOverParams{Owner: "w", Lease: time.Minute})
		require.ErrorIs(t, err, inbox.ErrIllegalTransition)
		_, err = b.store.FencePending(nil)
		require.ErrorIs(t, err, inbox.ErrIllegalTransition)
		require.ErrorIs(t, b.store.SaveOutput(b.ctx, b.db, nil, []byte("x")), inbox.ErrIllegalTransition)
		for name, l := range map[string]*inbox.Lease{"nil": nil, "zero": {}} {
			require.ErrorIs(t, l.Complete(b.ctx, inbox.Outcome{}), inbox.ErrIllegalTransition, name)
			require.ErrorIs(t, l.Fail(b.ctx, "x"), inbox.ErrIllegalTransition, name)
			require.ErrorIs(t, l.Pend(b.ctx, "", "x"), inbox.ErrIllegalTransition, name)
			require.ErrorIs(t, l.Release(b.ctx, "x"), inbox.ErrIllegalTransition, name)
			require.ErrorIs(t, l.Extend(b.ctx, time.Minute), inbox.ErrIllegalTransition, name)
			require.Zero(t, l.ID(), name)
			require.Zero(t, l.Attempt(), name)
			require.Empty(t, l.Owner(), name)
			require.Zero(t, l.Until(), name)
			require.Empty(t, l.Dropped(), name)
		}
		errs := b.store.CompleteMany(b.ctx, []inbox.Completion{{}, {Lease: &inbox.Lease{}}})
		require.Len(t, errs, 2)
		for _, err := range errs {
			require.Error(t, err)
		}
		// A record that is not the store's to take over.
		_, err = b.store.TakeOver(b.ctx, &inbox.Record{}, inbox.TakeOverParams{Owner: "w", Lease: time.Minute})
		require.ErrorIs(t, err, inbox.ErrIllegalTransition)
		require.Zero(t, b.records(t))
	})

	t.Run("GarbageFiltersAndCursors", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		_, err := b.store.Claim(b.ctx, b.db, inbox.ClaimParams{ID: id("op", "k"), PayloadHash: hash("x")})
		require.NoError(t, err)
		for name, f := range map[string]inbox.Filter{
			"cursor not base64":         {After: "!!!"},
			"cursor of one part":        {After: base64.RawURLEncoding.EncodeToString([]byte("k"))},
			"cursor of four parts":      {After: base64.RawURLEncoding.EncodeToString([]byte("a\x00b\x00c\x00d"))},
			"cursor of invalid UTF-8":   {After: base64.RawURLEncoding.EncodeToString([]byte("\x00op\x00\xff"))},
			"cursor padded":             {After: base64.URLEncoding.EncodeToString([]byte("\x00op\x00k"))},
			"negative limit":            {Limit: -1},
			"negative age":              {OlderThan: -time.Second},
			"negative attempt":          {AttemptAbove: -1},
			"unknown status":            {Status: "done"},
			"status with a space":       {Status: "completed "},
			"scope of invalid UTF-8":    {Scope: "\xff", ByScope: true},
			"operation with a NUL byte": {Operation: "o\x00"},
		} {
			_, err := b.store.List(b.ctx, f)
			require.ErrorIs(t, err, inbox.ErrInvalidParams, name)
		}
		// Limits and ages at the ends of their types are read as what
		// they say: all of it, or nothing.
		page, err := b.store.List(b.ctx, inbox.Filter{Limit: math.MaxInt, OlderThan: math.MaxInt64, AttemptAbove: math.MaxInt64})
		require.NoError(t, err)
		require.Empty(t, page.Records)
		page, err = b.store.List(b.ctx, inbox.Filter{Limit: math.MaxInt})
		require.NoError(t, err)
		require.Len(t, page.Records, 1)

		for name, f := range map[string]inbox.AuditFilter{
			"cursor not base64": {After: "!!!"},
			"negative limit":    {Limit: -1},
			"unknown action":    {Action: "delete"},
		} {
			_, _, err := b.store.ListAudit(b.ctx, f)
			require.ErrorIs(t, err, inbox.ErrInvalidParams, name)
		}
		for name, a := range map[string]inbox.Actor{
			"blank name":        {Name: " \t", Reason: "r"},
			"blank reason":      {Name: "ops", Reason: "\n"},
			"NUL in the name":   {Name: "ops\x00", Reason: "r"},
			"invalid reason":    {Name: "ops", Reason: "\xff"},
			"name too long":     {Name: strings.Repeat("n", inbox.MaxActorLen+1), Reason: "r"},
			"reason too long":   {Name: "ops", Reason: strings.Repeat("r", inbox.MaxReasonLen+1)},
			"terminal escapes?": {Name: "ops", Reason: "\x1b[2J"}, // storable: accepted below
		} {
			_, err := b.store.Purge(b.ctx, inbox.PurgeParams{Audit: &a})
			if name == "terminal escapes?" {
				require.NoError(t, err, name)
				continue
			}
			require.ErrorIs(t, err, inbox.ErrInvalidParams, name)
			_, err = b.store.Forget(b.ctx, inbox.ForgetParams{ID: id("op", "k"), Actor: a})
			require.ErrorIs(t, err, inbox.ErrInvalidParams, name)
		}
		require.Equal(t, 1, b.records(t))
		require.True(t, errors.Is(inbox.ErrInvalidParams, inbox.ErrInvalidParams))
	})
}
