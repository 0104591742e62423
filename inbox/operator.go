package inbox

import (
	"context"
	"database/sql"
	"encoding/base64"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// The operator tools: listing and looking up records, an overview of the
// table, and the two actions an operator takes on one record — settling it
// ([Store.Resolve]) and forgetting it ([Store.Forget]) — each recorded in
// the audit table in the transaction that makes the change (see
// [Store.ListAudit]). They run on the store's own database, never in a
// caller's transaction, and never touch a record a worker holds under a
// live lease.

// Listing limits.
const (
	// DefaultListLimit is the page size of [Store.List] and
	// [Store.ListAudit] when none is asked for.
	DefaultListLimit = 50
	// MaxListLimit is the largest page; a larger limit reads this many.
	MaxListLimit = 1000
)

// Limits on an [Actor], in bytes.
const (
	MaxActorLen  = 255
	MaxReasonLen = 2048
)

// Filter selects the records [Store.List] returns. The zero value selects
// every record.
type Filter struct {
	// Status, when not empty, keeps only records in that status.
	Status Status
	// Operation, when not empty, keeps only records of that operation.
	Operation string
	// Scope keeps only the records of that scope when ByScope is true (""
	// is a real scope, the global one); it is ignored otherwise.
	Scope   string
	ByScope bool
	// OlderThan, when positive, keeps only records created before the
	// store's now ([Store.Now]) minus OlderThan.
	OlderThan time.Duration
	// AttemptAbove keeps only records whose attempt is greater: 1 finds
	// the records that were taken over at least once. 0 keeps any.
	AttemptAbove int64
	// Order is the order of the records: the primary key's (the zero
	// value), or one of [ListOrders]. A cursor (After) belongs to the
	// order it was read in.
	Order ListOrder
	// After is the cursor of the page to read: the previous page's
	// Page.Next. "" reads the first page.
	After string
	// Limit is the page size. Defaults to DefaultListLimit; a limit above
	// MaxListLimit reads MaxListLimit records.
	Limit int
}

// OrderColumn is a column [Store.List] can order records by.
type OrderColumn string

// The columns a listing can be ordered by.
const (
	// OrderByKey is the primary key: scope, operation, key. The default.
	OrderByKey OrderColumn = ""
	// OrderByCreated is when the record was first claimed.
	OrderByCreated OrderColumn = "created_at"
	// OrderByUpdated is the record's last change.
	OrderByUpdated OrderColumn = "updated_at"
	// OrderByAttempt is the record's attempt: how often it was taken over,
	// plus one.
	OrderByAttempt OrderColumn = "attempt"
)

// ListOrder is the order of a listing: by Column, smallest (oldest)
// first, or largest (newest) first with Desc. Records that tie on Column
// follow in primary-key order (reversed with Desc), which keeps keyset
// paging exact: a page continues after the last row of the one before.
// The zero value is the primary key's order, which has no Desc.
type ListOrder struct {
	Column OrderColumn
	Desc   bool
}

// ListOrders returns the orders besides the primary key's that
// [Store.List] reads records in, and that a dialect's
// [Queries.ListRecordsBy] must support: every OrderColumn but the key,
// each way.
func ListOrders() []ListOrder {
	var out []ListOrder
	for _, c := range []OrderColumn{OrderByCreated, OrderByUpdated, OrderByAttempt} {
		out = append(out, ListOrder{Column: c}, ListOrder{Column: c, Desc: true})
	}
	return out
}

// String names the order as a sort parameter does: the column, with a
// leading "-" when Desc; "key" for the primary key's.
func (o ListOrder) String() string {
	name := string(o.Column)
	if o.Column == OrderByKey {
		name = "key"
	}
	if o.Desc {
		return "-" + name
	}
	return name
}

// valid reports whether o is the key's order or one of ListOrders.
func (o ListOrder) valid() bool {
	if o == (ListOrder{}) {
		return true
	}
	for _, l := range ListOrders() {
		if o == l {
			return true
		}
	}
	return false
}

// Page is one page of [Store.List].
type Page struct {
	// Records are in the filter's order: primary-key order (scope,
	// operation, key) unless Filter.Order says otherwise.
	Records []*Record
	// Next is the cursor of the next page (Filter.After); "" when there
	// are no more records.
	Next string
}

// List returns the records f selects, one page at a time in primary-key
// order (scope, operation, key) or f.Order, Result loaded. Pages are
// keyset-paged: a record inserted or deleted while an operator pages does
// not shift the others. In primary-key order each page costs an index
// range scan — plus, with filters other than the scope, the records it
// skips; in any other order (no index covers it) each page reads and sorts
// every record the filters select, a cost that grows with the table,
// meant for an operator's screen. A record whose order column changes
// while an operator pages may show twice or not at all. Invalid filters
// are refused with [ErrInvalidParams].
func (s *Store) List(ctx context.Context, f Filter) (Page, error) {
	limit, err := pageLimit(f.Limit)
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	if f.Status != "" && !f.Status.Valid() {
		errs = append(errs, fmt.Errorf("status %q is not a status", f.Status))
	}
	if err := CheckText(f.Operation, MaxOperationLen); err != nil {
		errs = append(errs, fmt.Errorf("operation %w", err))
	}
	if err := CheckText(f.Scope, MaxScopeLen); f.ByScope && err != nil {
		errs = append(errs, fmt.Errorf("scope %w", err))
	}
	if f.OlderThan < 0 {
		errs = append(errs, fmt.Errorf("OlderThan %v is negative", f.OlderThan))
	}
	if f.AttemptAbove < 0 {
		errs = append(errs, fmt.Errorf("AttemptAbove %d is negative", f.AttemptAbove))
	}
	if !f.Order.valid() {
		errs = append(errs, fmt.Errorf("order %s is not the key's or one of %v", f.Order, ListOrders()))
	}
	var (
		after ID
		at    sortValue
		err2  error
	)
	if f.Order == (ListOrder{}) {
		after, err2 = decodeCursor(f.After)
	} else {
		at, after, err2 = decodeOrderedCursor(f.After, f.Order)
	}
	if err2 != nil {
		errs = append(errs, err2)
	}
	if err := invalidParams("list", errs); err != nil {
		return Page{}, err
	}
	p := &params{status: f.Status, id: ID{Operation: f.Operation}, byScope: f.ByScope,
		attempt: f.AttemptAbove, after: after, limit: limit + 1}
	if f.ByScope {
		p.id.Scope = f.Scope
	}
	if f.OlderThan > 0 {
		p.before = s.now().Add(-f.OlderThan)
	}
	st := s.q.listRecords
	if f.Order != (ListOrder{}) {
		st = s.q.listRecordsBy[f.Order]
		p.afterSet, p.afterTime, p.afterAttempt = f.After != "", at.time, at.attempt
	}
	recs, err := s.list(ctx, "list", st, p)
	if err != nil {
		return Page{}, err
	}
	page := Page{Records: recs}
	if len(recs) > limit {
		page.Records = recs[:limit]
		last := recs[limit-1]
		if f.Order == (ListOrder{}) {
			page.Next = encodeCursor(last.ID)
		} else {
			page.Next = encodeOrderedCursor(f.Order, last)
		}
	}
	return page, nil
}

// sortValue is the order column's value of the row a page continues
// after: a time, or the attempt.
type sortValue struct {
	time    time.Time
	attempt int64
}

// An ordered cursor is the order, the last row's order column (Unix
// microseconds or the attempt) and its key, joined by NUL bytes and
// base64url-encoded; it has five parts where a key cursor has three.
func encodeOrderedCursor(o ListOrder, r *Record) string {
	var v int64
	switch o.Column {
	case OrderByCreated:
		v = r.CreatedAt.UnixMicro()
	case OrderByUpdated:
		v = r.UpdatedAt.UnixMicro()
	case OrderByAttempt:
		v = r.Attempt
	}
	return base64.RawURLEncoding.EncodeToString([]byte(o.String() + "\x00" + strconv.FormatInt(v, 10) + "\x00" +
		r.Scope + "\x00" + r.Operation + "\x00" + r.Key))
}

func decodeOrderedCursor(c string, o ListOrder) (sortValue, ID, error) {
	if c == "" {
		return sortValue{}, ID{}, nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(c)
	parts := strings.Split(string(raw), "\x00")
	if err != nil || len(parts) != 5 {
		return sortValue{}, ID{}, errors.New("the cursor is not one a listing in this order returned")
	}
	if parts[0] != o.String() {
		return sortValue{}, ID{}, fmt.Errorf("the cursor belongs to order %q, not %s", parts[0], o)
	}
	v, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil {
		return sortValue{}, ID{}, errors.New("the cursor is not one a listing in this order returned")
	}
	id := ID{Scope: parts[2], Operation: parts[3], Key: parts[4]}
	if err := id.Validate(); err != nil {
		return sortValue{}, ID{}, fmt.Errorf("the cursor is not one a listing returned: %w", err)
	}
	var at sortValue
	if o.Column == OrderByAttempt {
		at.attempt = v
	} else {
		at.time = time.UnixMicro(v).UTC()
	}
	return at, id, nil
}

// pageLimit applies a listing's default and maximum.
func pageLimit(limit int) (int, error) {
	switch {
	case limit < 0:
		return 0, fmt.Errorf("limit %d is negative", limit)
	case limit == 0:
		return DefaultListLimit, nil
	}
	return min(limit, MaxListLimit), nil
}

// invalidParams wraps the reasons a call's parameters are unusable with
// [ErrInvalidParams]; nil when there are none.
func invalidParams(what string, errs []error) error {
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("inbox: %s: %w: %w", what, ErrInvalidParams, err)
	}
	return nil
}

// A cursor is the last key of a page: its three parts joined by NUL bytes
// (which no part holds), base64url-encoded so that it travels in a URL.
func encodeCursor(id ID) string {
	return base64.RawURLEncoding.EncodeToString([]byte(id.Scope + "\x00" + id.Operation + "\x00" + id.Key))
}

func decodeCursor(c string) (ID, error) {
	if c == "" {
		return ID{}, nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(c)
	parts := strings.Split(string(raw), "\x00")
	if err != nil || len(parts) != 3 {
		return ID{}, errors.New("the cursor is not one a listing returned")
	}
	id := ID{Scope: parts[0], Operation: parts[1], Key: parts[2]}
	if err := id.Validate(); err != nil {
		return ID{}, fmt.Errorf("the cursor is not one a listing returned: %w", err)
	}
	return id, nil
}

// Count is the number of records of one operation in one status.
type Count struct {
	Operation string
	Status    Status
	N         int64
}

// Overview describes the whole inbox table, for a dashboard.
type Overview struct {
	// Counts are the records by operation and status, sorted by operation
	// (byte order), then status. A pair without records is left out.
	Counts []Count
	// Total is the number of records: the sum of Counts.
	Total int64
	// OldestPending is the least recently created pending record; nil
	// when none is pending.
	OldestPending *Record
	// OldestExpiredLease is the least recently created processing record
	// whose lease expired (or was released); nil when none. Its worker is
	// gone and no delivery took it over yet.
	OldestExpiredLease *Record
	// AwaitingPurge counts the finished records whose expires_at is
	// before Now: what the next purge deletes.
	AwaitingPurge int64
	// OldestExpired is the earliest expires_at of a finished record; zero
	// when none. Now minus it is the purge lag when it is in the past.
	OldestExpired time.Time
	// Now is the store's clock when the overview was read.
	Now time.Time
}

// Overview counts the records by operation and status and finds the
// oldest that need attention. The counts read the whole table (or its
// primary-key index): a cost that grows with the table, meant for an
// operator's screen, not for a tight loop — [Store.Stats] is the cheap
// figure for metrics. The figures come from separate statements, so on a
// busy table they may not add up to one instant.
func (s *Store) Overview(ctx context.Context) (Overview, error) {
	o := Overview{Now: s.now()}
	fail := func(err error) (Overview, error) { return Overview{}, fmt.Errorf("inbox: overview: %w", err) }
	rows, err := s.query(ctx, s.db, s.q.countByOperation, &params{})
	if err != nil {
		return fail(s.Classify(err))
	}
	defer rows.Close()
	for rows.Next() {
		var (
			c      Count
			status string
		)
		if err := rows.Scan(&c.Operation, &status, &c.N); err != nil {
			return fail(err)
		}
		c.Status = Status(status)
		o.Counts = append(o.Counts, c)
		o.Total += c.N
	}
	if err := rows.Err(); err != nil {
		return fail(s.Classify(err))
	}
	_ = rows.Close()
	sort.Slice(o.Counts, func(i, j int) bool {
		a, b := o.Counts[i], o.Counts[j]
		if a.Operation != b.Operation {
			return a.Operation < b.Operation
		}
		return a.Status < b.Status
	})
	if o.OldestPending, err = s.optionalRecord(ctx, s.q.oldestPending, &params{}); err != nil {
		return fail(err)
	}
	if o.OldestExpiredLease, err = s.optionalRecord(ctx, s.q.oldestExpiredLease, &params{now: o.Now}); err != nil {
		return fail(err)
	}
	if err := s.queryRow(ctx, s.db, s.q.countPurgeable, &params{before: o.Now}).Scan(&o.AwaitingPurge); err != nil {
		return fail(s.Classify(err))
	}
	if err := s.queryRow(ctx, s.db, s.q.oldestExpired, &params{}).Scan(timeCol{&o.OldestExpired}); err != nil {
		return fail(s.Classify(err))
	}
	return o, nil
}

// MaxActivityBuckets is the most buckets [Store.Activity] counts at once.
const MaxActivityBuckets = 1000

// ActivityParams are the window [Store.Activity] counts: Buckets buckets
// of Width each, the first starting at Since.
type ActivityParams struct {
	Since   time.Time
	Width   time.Duration // at least a microsecond, the databases' precision
	Buckets int           // 1 to MaxActivityBuckets
}

// ActivityBucket counts the records whose last change fell in [Start,
// End), by their status now.
type ActivityBucket struct {
	Start, End time.Time
	Counts     map[Status]int64
}

// Activity counts the records by status and by when they last changed
// (updated_at), in the buckets p describes: what a dashboard charts as
// outcomes over time. A finished record counts where it finished (or was
// last resolved), a pending one where it was left pending, a processing
// one at its last claim or heartbeat. Records purged or forgotten are not
// counted: it describes the table as it is, not a history. The statement
// reads every record of the window (updated_at has no index of its own;
// MySQL's status index covers it), a cost for an operator's screen, not
// for a tight loop. Invalid params are [ErrInvalidParams].
func (s *Store) Activity(ctx context.Context, p ActivityParams) ([]ActivityBucket, error) {
	var errs []error
	if p.Since.IsZero() {
		errs = append(errs, errors.New("since is the zero time"))
	}
	if p.Width < time.Microsecond {
		errs = append(errs, fmt.Errorf("width %v is less than a microsecond", p.Width))
	}
	if p.Buckets < 1 || p.Buckets > MaxActivityBuckets {
		errs = append(errs, fmt.Errorf("buckets %d is not between 1 and %d", p.Buckets, MaxActivityBuckets))
	}
	if err := invalidParams("activity", errs); err != nil {
		return nil, err
	}
	width := p.Width.Truncate(time.Microsecond)
	since := dbTime(p.Since)
	out := make([]ActivityBucket, p.Buckets)
	for i := range out {
		out[i] = ActivityBucket{Start: since.Add(time.Duration(i) * width), End: since.Add(time.Duration(i+1) * width),
			Counts: map[Status]int64{}}
	}
	rows, err := s.query(ctx, s.db, s.q.countByUpdated, &params{since: since, width: width, before: out[len(out)-1].End})
	if err != nil {
		return nil, fmt.Errorf("inbox: activity: %w", s.Classify(err))
	}
	defer rows.Close()
	for rows.Next() {
		var (
			status string
			bucket int64
			n      int64
		)
		if err := rows.Scan(&status, &bucket, &n); err != nil {
			return nil, fmt.Errorf("inbox: activity: %w", err)
		}
		if bucket >= 0 && bucket < int64(len(out)) { // the window's bounds say it is; a dialect's rounding might not
			out[bucket].Counts[Status(status)] += n
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("inbox: activity: %w", s.Classify(err))
	}
	return out, nil
}

// OldestCreated returns when the oldest record of operation was created
// (first claimed), or the zero time when the operation has no record;
// operation "" looks at every operation. A message published before that
// time has no record older than it to be recognised by: a replay that
// reaches back that far relies on records that were purged, forgotten or
// never written. The statement reads the whole table (created_at has no
// index), for an operator's occasional question such as a replay's dry
// run, not for a tight loop. An operation that is not storable text is
// [ErrInvalidKey].
func (s *Store) OldestCreated(ctx context.Context, operation string) (time.Time, error) {
	if err := CheckText(operation, MaxOperationLen); err != nil {
		return time.Time{}, fmt.Errorf("inbox: oldest created: %w: operation %w", ErrInvalidKey, err)
	}
	var t time.Time
	p := &params{id: ID{Operation: operation}}
	if err := s.queryRow(ctx, s.db, s.q.oldestCreated, p).Scan(timeCol{&t}); err != nil {
		return time.Time{}, fmt.Errorf("inbox: oldest created: %w", s.Classify(err))
	}
	return t, nil
}

// optionalRecord runs a statement that returns one record or none.
func (s *Store) optionalRecord(ctx context.Context, st stmt, p *params) (*Record, error) {
	rec, err := scanRecord(s.queryRow(ctx, s.db, st, p))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, s.Classify(err)
	}
	return rec, nil
}

// digestScanPage is how many keys one statement of a lookup by digest
// reads back to hash them; digestServerPage how many one statement
// hashes on the server (DigestQueries), reading back only the match.
const (
	digestScanPage   = 1000
	digestServerPage = 100_000
)

// FindByDigest returns the record whose [ID.Digest] is digest — what log
// lines print as key_digest — of operation operation ("" for every
// operation), or [ErrNotFound]. It is [Store.ScanDigest] without progress
// reports.
func (s *Store) FindByDigest(ctx context.Context, digest string, operation string) (*Record, error) {
	return s.ScanDigest(ctx, DigestScan{Digest: digest, Operation: operation})
}

// DigestScan says what [Store.ScanDigest] looks for.
type DigestScan struct {
	// Digest is the [ID.Digest] looked for: 16 lowercase hex characters.
	Digest string
	// Operation narrows the scan to one operation's records; "" reads
	// every operation's. The scan still reads every key: the primary
	// key does not lead with the operation.
	Operation string
	// Scope, when ByScope is true, narrows the scan to one scope's
	// records ("" is the global scope), and shortens it: the primary key
	// leads with the scope, so the scan starts at the scope's first key
	// and stops within a page past its last.
	Scope   string
	ByScope bool
	// PageSize is how many keys one statement reads: 0 for 100,000 where
	// the database hashes them (PostgreSQL, MySQL/MariaDB) and 1,000 where
	// they are sent here to be hashed (SQLite). Smaller pages make
	// shorter statements on a busy database, and a slower scan.
	PageSize int
	// Progress, when set, is called after each page of keys with how
	// many keys have been read so far.
	Progress func(keysRead int64)
}

// ScanDigest returns the record whose [ID.Digest] is p.Digest, of
// p.Operation, or [ErrNotFound]. A digest is a hash, so no index finds
// it: the scan reads the key columns of every record (of the operation)
// in primary-key order, a page at a time, and hashes them. PostgreSQL and
// MySQL/MariaDB hash on the server, 100,000 keys a statement
// (p.PageSize), and send back only the match; SQLite sends every key to
// be hashed here, 1,000 a statement. Each statement is short, so the scan holds no snapshot or
// lock for long, however large the table; docs/operations.md gives its
// speed. Should two keys share a digest (64 bits of SHA-256), the first
// in key order is returned. A digest that is not 16 lowercase hex
// characters, or an operation that is not storable text, is
// [ErrInvalidKey].
func (s *Store) ScanDigest(ctx context.Context, p DigestScan) (*Record, error) {
	digest, operation := p.Digest, p.Operation
	if !isLowerHex(digest, 16) {
		return nil, fmt.Errorf("inbox: find by digest: %w: digest %q is not 16 lowercase hex characters", ErrInvalidKey, digest)
	}
	if err := CheckText(operation, MaxOperationLen); err != nil {
		return nil, fmt.Errorf("inbox: find by digest: %w: operation %w", ErrInvalidKey, err)
	}
	if err := CheckText(p.Scope, MaxScopeLen); p.ByScope && err != nil {
		return nil, fmt.Errorf("inbox: find by digest: %w: scope %w", ErrInvalidKey, err)
	}
	if p.PageSize < 0 {
		return nil, fmt.Errorf("inbox: find by digest: %w: page size %d is negative", ErrInvalidParams, p.PageSize)
	}
	var (
		after  ID
		read   int64
		server = s.q.keyAt.SQL != ""
		page   = p.PageSize
		want   = func(id ID) bool { return id.Digest() == digest }
	)
	if p.ByScope {
		// Every key of the scope sorts after this one: a record's
		// operation and key are never empty.
		after = ID{Scope: p.Scope}
		want = func(id ID) bool { return id.Scope == p.Scope && id.Digest() == digest }
	}
	if page == 0 {
		page = digestScanPage
		if server {
			page = digestServerPage
		}
	}
	for {
		var (
			match *ID
			last  ID
			n     int
			err   error
		)
		if server {
			match, last, n, err = s.hashKeys(ctx, operation, after, digest, page, want)
			if err == nil && n == 0 {
				// Fewer than a page of keys are left: read them here.
				server = false
				continue
			}
		} else {
			match, last, n, err = s.scanKeys(ctx, operation, after, page, want)
		}
		if err != nil {
			return nil, fmt.Errorf("inbox: find by digest: %w", err)
		}
		read += int64(n)
		if p.Progress != nil {
			p.Progress(read)
		}
		if match != nil {
			rec, err := s.Get(ctx, s.db, *match)
			if err != nil {
				return nil, fmt.Errorf("inbox: find by digest %s: %w", digest, err)
			}
			return rec, nil
		}
		if (!server && n < page) || (p.ByScope && last.Scope != p.Scope) {
			// The table's last keys, or past the scope's.
			return nil, fmt.Errorf("inbox: find by digest %s: %w", digest, ErrNotFound)
		}
		after = last
	}
}

// hashKeys hashes the next page keys after after on the server, where
// only those whose digest is digest are sent back, and returns the first
// of them want accepts, the page's last key and its size: 0 when fewer
// keys than a page are left (none read).
func (s *Store) hashKeys(ctx context.Context, operation string, after ID, digest string, page int, want func(ID) bool) (match *ID, last ID, n int, err error) {
	p := &params{id: ID{Operation: operation}, after: after, offset: page - 1}
	if err := s.queryRow(ctx, s.db, s.q.keyAt, p).Scan(&last.Scope, &last.Operation, &last.Key); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return nil, ID{}, 0, nil
		}
		return nil, ID{}, 0, s.Classify(err)
	}
	p.until, p.digest, p.limit = last, digest, page
	err = s.eachKey(ctx, s.q.selectDigest, p, func(id ID) bool {
		// Checked here too: a database that hashed other bytes than the
		// store wrote must not hand over another record.
		if want(id) {
			match = &id
		}
		return match == nil
	})
	if err != nil {
		return nil, ID{}, 0, err
	}
	return match, last, page, nil
}

// scanKeys reads one page of keys after after and returns the first want
// accepts, the page's last key and how many keys it held.
func (s *Store) scanKeys(ctx context.Context, operation string, after ID, page int, want func(ID) bool) (match *ID, last ID, n int, err error) {
	err = s.eachKey(ctx, s.q.selectKeys, &params{id: ID{Operation: operation}, after: after, limit: page}, func(id ID) bool {
		n++
		last = id
		if want(id) {
			match = &id
		}
		return match == nil
	})
	if err != nil {
		return nil, ID{}, 0, err
	}
	return match, last, n, nil
}

// eachKey runs a statement that returns keys (scope, operation, key) and
// calls f with each until f returns false.
func (s *Store) eachKey(ctx context.Context, st stmt, p *params, f func(ID) bool) error {
	rows, err := s.query(ctx, s.db, st, p)
	if err != nil {
		return s.Classify(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id ID
		if err := rows.Scan(&id.Scope, &id.Operation, &id.Key); err != nil {
			return err
		}
		if !f(id) {
			return nil
		}
	}
	if err := rows.Err(); err != nil {
		return s.Classify(err)
	}
	return nil
}

func isLowerHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// Actor names who takes an operator action and why, for the audit table.
type Actor struct {
	// Name identifies the operator (a login, an e-mail address). Required:
	// storable text of at most MaxActorLen bytes.
	Name string
	// Reason says why (a ticket, a sentence). Required: storable text of
	// at most MaxReasonLen bytes.
	Reason string
}

// check reports why a is unusable; nil when it is fine.
func (a Actor) check() []error {
	var errs []error
	for _, f := range []struct {
		name, v string
		max     int
	}{{"actor name", a.Name, MaxActorLen}, {"reason", a.Reason, MaxReasonLen}} {
		if strings.TrimSpace(f.v) == "" {
			errs = append(errs, fmt.Errorf("%s is empty", f.name))
		} else if err := CheckText(f.v, f.max); err != nil {
			errs = append(errs, fmt.Errorf("%s %w", f.name, err))
		}
	}
	return errs
}

// ResolveParams are the inputs of [Store.Resolve].
type ResolveParams struct {
	// ID is the record's. Required.
	ID ID
	// To is StatusCompleted (the effect happened) or StatusFailed (it did
	// not, and must not be retried).
	To Status
	// Attempt is the attempt the operator saw: the resolve applies only
	// while the record is still at it. 0 takes the record's current one.
	Attempt int64
	// Actor is who resolves it and why. Required.
	Actor Actor
	// ExternalRef is the provider's reference, stored when To is
	// completed (empty keeps the stored one); refused with StatusFailed.
	// Storable text of at most MaxExternalRefLen bytes.
	ExternalRef string
	// Error is stored as the record's error when To is failed; it
	// defaults to "resolved as failed by <actor>: <reason>". Refused with
	// StatusCompleted, which clears the error. Storable text of at most
	// MaxErrorLen bytes.
	Error string
	// DryRun does every check and computes the outcome but changes
	// nothing and writes no audit entry.
	DryRun bool
}

func (p ResolveParams) check() error {
	var errs []error
	if err := p.ID.Validate(); err != nil {
		errs = append(errs, err)
	}
	switch p.To {
	case StatusCompleted:
		if p.Error != "" {
			errs = append(errs, errors.New("an error is stored only when resolving as failed"))
		}
	case StatusFailed:
		if p.ExternalRef != "" {
			errs = append(errs, errors.New("an external reference is stored only when resolving as completed"))
		}
	default:
		errs = append(errs, fmt.Errorf("a record is resolved as %s or %s, not %q", StatusCompleted, StatusFailed, p.To))
	}
	if p.Attempt < 0 {
		errs = append(errs, fmt.Errorf("attempt %d is negative", p.Attempt))
	}
	errs = append(errs, p.Actor.check()...)
	if err := CheckText(p.ExternalRef, MaxExternalRefLen); err != nil {
		errs = append(errs, fmt.Errorf("external reference %w", err))
	}
	if err := CheckText(p.Error, MaxErrorLen); err != nil {
		errs = append(errs, fmt.Errorf("error %w", err))
	}
	return invalidParams("resolve", errs)
}

// Resolve settles a record an operator knows the outcome of: it moves a
// pending record, or a processing record whose lease has expired (or was
// released), to p.To, drops the lease, stores the external reference or
// the error, and keeps the record for its retention ([Record.Retention])
// from now — a record kept forever stays so. It returns the record before
// and after.
//
// It never touches a live lease: the record is read under a row lock and
// checked, and the UPDATE is itself fenced by attempt, status and lease
// ("status = 'pending' OR lease_until IS NULL OR lease_until < now"), so a
// worker that takes the record over or completes it in the meantime wins
// and Resolve changes nothing. The audit entry (action "resolve") is
// written in the same transaction: it exists exactly when the change
// committed.
//
// Errors: [ErrInvalidParams] for unusable parameters, [ErrNotFound],
// [ErrLeaseLost] when the record is no longer at p.Attempt (or moved while
// being resolved), [ErrLeaseLive] when it is processing under a live
// lease, [ErrNotResolvable] when it is completed or failed already.
func (s *Store) Resolve(ctx context.Context, p ResolveParams) (before, after *Record, err error) {
	if err := p.check(); err != nil {
		return nil, nil, err
	}
	errText := p.Error
	if p.To == StatusFailed && errText == "" {
		errText = StorableText("resolved as failed by "+p.Actor.Name+": "+p.Actor.Reason, MaxErrorLen)
	}
	var out *Record
	before, err = s.operate(ctx, operatorAction{
		what: ActionResolve, id: p.ID, actor: p.Actor, dryRun: p.DryRun,
		check: func(rec *Record, attempt int64, now time.Time) error {
			return resolvable(rec, attempt, now)
		},
		attempt: p.Attempt,
		write: func(rec *Record, now time.Time) (stmt, *params) {
			a := *rec
			a.Status, a.LeaseOwner, a.LeaseUntil, a.UpdatedAt, a.Error = p.To, "", time.Time{}, now.UTC(), errText
			if p.ExternalRef != "" {
				a.ExternalRef = p.ExternalRef
			}
			a.ExpiresAt = renewedExpiry(rec, now).UTC()
			out = &a
			return s.q.resolve, &params{id: rec.ID, status: p.To, externalRef: p.ExternalRef, errS: errText,
				updatedAt: now, expiresAt: a.ExpiresAt, attempt: rec.Attempt, fromStatus: rec.Status, now: now}
		},
		statusAfter: p.To,
	})
	if err != nil {
		return nil, nil, err
	}
	return before, out, nil
}

// renewedExpiry is the expiry of rec when it finishes at now: its
// retention from now, never for a record kept forever.
func renewedExpiry(rec *Record, now time.Time) time.Time {
	if rec.ExpiresAt.IsZero() {
		return time.Time{}
	}
	return dbTime(now.Add(max(rec.Retention(), 0)))
}

// resolvable reports why rec may not be resolved at now by an operator who
// saw attempt (0: any).
func resolvable(rec *Record, attempt int64, now time.Time) error {
	if err := sameAttempt(rec, attempt); err != nil {
		return err
	}
	switch {
	case rec.Status.Finished():
		return fmt.Errorf("record is %s already: %w", rec.Status, ErrNotResolvable)
	case rec.Status == StatusProcessing && !rec.LeaseExpired(now):
		return liveLease(rec, now)
	case rec.Status != StatusPending && rec.Status != StatusProcessing:
		return fmt.Errorf("record is %q: %w", rec.Status, ErrNotResolvable)
	}
	return nil
}

// forgettable reports why rec may not be forgotten at now by an operator
// who saw attempt (0: any).
func forgettable(rec *Record, attempt int64, now time.Time) error {
	if err := sameAttempt(rec, attempt); err != nil {
		return err
	}
	if rec.Status == StatusProcessing && !rec.LeaseExpired(now) {
		return liveLease(rec, now)
	}
	return nil
}

func sameAttempt(rec *Record, attempt int64) error {
	if attempt != 0 && rec.Attempt != attempt {
		return fmt.Errorf("record is %s at attempt %d, not %d: %w", rec.Status, rec.Attempt, attempt, ErrLeaseLost)
	}
	return nil
}

func liveLease(rec *Record, now time.Time) error {
	return fmt.Errorf("record is processing at attempt %d under a lease of %q until %s (now %s): %w",
		rec.Attempt, rec.LeaseOwner, rec.LeaseUntil.Format(time.RFC3339Nano), now.Format(time.RFC3339Nano), ErrLeaseLive)
}

// ForgetParams are the inputs of [Store.Forget].
type ForgetParams struct {
	// ID is the record's. Required.
	ID ID
	// Attempt is the attempt the operator saw: the record is deleted only
	// while it is still at it. 0 takes the record's current one.
	Attempt int64
	// Actor is who forgets it and why. Required.
	Actor Actor
	// DryRun does every check but deletes nothing and writes no audit
	// entry.
	DryRun bool
}

func (p ForgetParams) check() error {
	var errs []error
	if err := p.ID.Validate(); err != nil {
		errs = append(errs, err)
	}
	if p.Attempt < 0 {
		errs = append(errs, fmt.Errorf("attempt %d is negative", p.Attempt))
	}
	errs = append(errs, p.Actor.check()...)
	return invalidParams("forget", errs)
}

// Forget deletes one record, whatever its status, so that the intent is
// forgotten: the next delivery of its key runs the work again. It refuses
// a processing record under a live lease ([ErrLeaseLive]): its worker may
// be doing the work right now. It returns the record it deleted (or would
// delete, with DryRun).
//
// Like [Store.Resolve], it reads the record under a row lock, and the
// DELETE is fenced by attempt, status and lease; the audit entry (action
// "forget", with the record as it was) is written in the same
// transaction. Errors: [ErrInvalidParams], [ErrNotFound], [ErrLeaseLost]
// when the record is no longer at p.Attempt, [ErrLeaseLive].
func (s *Store) Forget(ctx context.Context, p ForgetParams) (*Record, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	return s.operate(ctx, operatorAction{
		what: ActionForget, id: p.ID, actor: p.Actor, dryRun: p.DryRun, attempt: p.Attempt,
		check: forgettable,
		write: func(rec *Record, now time.Time) (stmt, *params) {
			return s.q.forget, &params{id: rec.ID, attempt: rec.Attempt, fromStatus: rec.Status, now: now}
		},
	})
}

// operatorAction is one operator action on one record.
type operatorAction struct {
	what    string // the audit action
	id      ID
	attempt int64 // the attempt the operator saw; 0 for any
	actor   Actor
	dryRun  bool
	// check reports why the action may not be taken on rec at now by an
	// operator who saw attempt (0: any).
	check func(rec *Record, attempt int64, now time.Time) error
	// write returns the fenced statement that takes the action on rec.
	write       func(rec *Record, now time.Time) (stmt, *params)
	statusAfter Status
}

// operate takes an operator action in one transaction: it reads the
// record under a row lock, checks it, runs the fenced statement and adds
// the audit entry. It returns the record as it was before.
func (s *Store) operate(ctx context.Context, a operatorAction) (_ *Record, err error) {
	what := a.what
	if a.dryRun {
		rec, err := s.Get(ctx, s.db, a.id)
		if err != nil {
			return nil, fmt.Errorf("inbox: %s (dry run): %w", what, err)
		}
		now := s.now()
		if err := a.check(rec, a.attempt, now); err != nil {
			return nil, fmt.Errorf("inbox: %s (dry run): %w", what, err)
		}
		a.write(rec, now) // computes the outcome, runs nothing
		return rec, nil
	}
	tx, err := s.db.BeginTx(txContext(ctx), nil)
	if err != nil {
		return nil, fmt.Errorf("inbox: %s: begin: %w", what, s.Classify(err))
	}
	committed := false
	defer func() {
		if !committed {
			_ = tx.Rollback()
		}
	}()
	rec, err := scanRecord(s.queryRow(ctx, tx, s.q.selectForUpdate, &params{id: a.id}))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("inbox: %s: %w", what, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("inbox: %s: read: %w", what, s.Classify(err))
	}
	now := s.now()
	if err := a.check(rec, a.attempt, now); err != nil {
		return nil, fmt.Errorf("inbox: %s: %w", what, err)
	}
	st, p := a.write(rec, now)
	res, err := s.exec(ctx, tx, st, p)
	if err != nil {
		return nil, fmt.Errorf("inbox: %s: %w", what, s.Classify(err))
	}
	n, err := res.RowsAffected()
	if err != nil {
		return nil, fmt.Errorf("inbox: %s: rows affected: %w", what, s.Classify(err))
	}
	if n != 1 {
		// The row lock keeps writers off, so only a dialect without one
		// gets here: say what happened to the record.
		_ = tx.Rollback()
		return nil, fmt.Errorf("inbox: %s: %w", what, s.fencedOff(ctx, a, rec))
	}
	snapshot, err := recordJSON(rec)
	if err != nil {
		return nil, fmt.Errorf("inbox: %s: %w", what, err)
	}
	_, err = s.exec(ctx, tx, s.q.insertAudit, &params{id: rec.ID, now: now, audit: auditParams{
		id: newAuditID(now), actor: a.actor.Name, action: what, reason: a.actor.Reason, beforeJSON: snapshot,
		statusBefore: rec.Status, attemptBefore: rec.Attempt, statusAfter: a.statusAfter, affected: 1,
	}})
	if err != nil {
		return nil, fmt.Errorf("inbox: %s: audit: %w", what, s.Classify(err))
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("inbox: %s: commit: %w", what, withCtxErr(ctx, s.Classify(err)))
	}
	committed = true
	return rec, nil
}

// fencedOff says why the fenced statement of a changed nothing on the
// record that read as rec: it is gone, moved to another attempt or status,
// or under a live lease again.
func (s *Store) fencedOff(ctx context.Context, a operatorAction, rec *Record) error {
	cur, err := s.Get(ctx, s.db, a.id)
	if err != nil {
		return err
	}
	if err := a.check(cur, rec.Attempt, s.now()); err != nil {
		return err
	}
	return fmt.Errorf("record changed while being written (%s at attempt %d, was %s at attempt %d): %w",
		cur.Status, cur.Attempt, rec.Status, rec.Attempt, ErrLeaseLost)
}

// txContext is the context of a transaction the store begins and ends
// itself, for statements that run under ctx: the end of ctx interrupts
// the statement under way, which then rolls the transaction back, but not
// the COMMIT. database/sql would otherwise roll a transaction back, or
// drivers abandon a COMMIT already sent, when the context ends, and report
// a change that then commits as failed.
func txContext(ctx context.Context) context.Context { return context.WithoutCancel(ctx) }

// withCtxErr adds ctx's error to err when ctx ended: database/sql rolls a
// transaction back when its context ends, and its Commit then reports only
// that the transaction is done.
func withCtxErr(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("%w (%w)", err, cerr)
	}
	return err
}
