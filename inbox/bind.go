package inbox

import (
	"fmt"
	"time"
)

// params are the values a statement can bind, by [Arg]. Each store method
// fills the ones its statement documents; bind picks them in the order the
// dialect's placeholders want.
type params struct {
	id                                           ID
	payloadHash                                  []byte
	status, fromStatus                           Status
	attempt                                      int64
	leaseOwner                                   string
	leaseUntil                                   time.Time
	result                                       []byte
	resourceID, correlationID, externalRef, errS string
	createdAt, updatedAt, expiresAt, now, before time.Time
	limit                                        int
	version                                      int
	name, lockName                               string
	byScope                                      bool
	after                                        ID            // keyset scans continue after this key
	afterSet                                     bool          // an ordered listing continues after a row
	afterTime                                    time.Time     // and this is the row's order column, a time
	afterAttempt                                 int64         // or its attempt
	since                                        time.Time     // the start of a window of time
	width                                        time.Duration // of one bucket of it
	bucket, bucketEnd                            time.Time
	audit                                        auditParams
	offset                                       int
	until                                        ID     // a keyset scan ends at this key
	digest                                       string // an ID's digest
}

// auditParams are the values of an audit entry.
type auditParams struct {
	id, actor, action, reason, beforeJSON string
	statusBefore, statusAfter             Status
	attemptBefore, affected               int64
}

// stmt is a rendered query ready to run: its SQL and its args' order.
type stmt Query

func (s *Store) bind(q stmt, p *params) []any {
	if len(q.Args) == 0 {
		return nil
	}
	args := make([]any, len(q.Args))
	for i, a := range q.Args {
		args[i] = s.arg(a, p)
	}
	return args
}

func (s *Store) arg(a Arg, p *params) any {
	switch a {
	case ArgScope:
		return p.id.Scope
	case ArgOperation:
		return p.id.Operation
	case ArgKey:
		return p.id.Key
	case ArgPayloadHash:
		return p.payloadHash
	case ArgStatus:
		return string(p.status)
	case ArgFromStatus:
		return string(p.fromStatus)
	case ArgAttempt:
		return p.attempt
	case ArgLeaseOwner:
		return p.leaseOwner
	case ArgLeaseUntil:
		return s.timeArg(p.leaseUntil)
	case ArgResult:
		if p.result == nil {
			return nil
		}
		return p.result
	case ArgResourceID:
		return p.resourceID
	case ArgCorrelationID:
		return p.correlationID
	case ArgExternalRef:
		return p.externalRef
	case ArgError:
		return p.errS
	case ArgCreatedAt:
		return s.timeArg(p.createdAt)
	case ArgUpdatedAt:
		return s.timeArg(p.updatedAt)
	case ArgExpiresAt:
		return s.timeArg(p.expiresAt)
	case ArgNow:
		return s.timeArg(p.now)
	case ArgBefore:
		return s.timeArg(p.before)
	case ArgLimit:
		return p.limit
	case ArgVersion:
		return p.version
	case ArgName:
		return p.name
	case ArgLockName:
		return p.lockName
	case ArgByScope:
		if p.byScope {
			return 1
		}
		return 0
	case ArgAfterScope:
		return p.after.Scope
	case ArgAfterOperation:
		return p.after.Operation
	case ArgAfterKey:
		return p.after.Key
	case ArgAfterSet:
		if p.afterSet {
			return 1
		}
		return 0
	case ArgAfterTime:
		return s.timeArg(p.afterTime)
	case ArgAfterAttempt:
		return p.afterAttempt
	case ArgSince:
		return s.timeArg(p.since)
	case ArgWidth:
		return int64(p.width / time.Microsecond)
	case ArgAuditID:
		return p.audit.id
	case ArgActor:
		return p.audit.actor
	case ArgReason:
		return p.audit.reason
	case ArgAction:
		return p.audit.action
	case ArgStatusBefore:
		return string(p.audit.statusBefore)
	case ArgAttemptBefore:
		return p.audit.attemptBefore
	case ArgStatusAfter:
		return string(p.audit.statusAfter)
	case ArgBeforeJSON:
		return p.audit.beforeJSON
	case ArgAffected:
		return p.audit.affected
	case ArgBucket:
		return s.timeArg(p.bucket)
	case ArgBucketEnd:
		return s.timeArg(p.bucketEnd)
	case ArgOffset:
		return p.offset
	case ArgUntilScope:
		return p.until.Scope
	case ArgUntilOperation:
		return p.until.Operation
	case ArgUntilKey:
		return p.until.Key
	case ArgDigest:
		return p.digest
	}
	// NewStore checked every query's args.
	panic(fmt.Sprintf("inbox: unknown %v", a))
}

func (s *Store) timeArg(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return s.dialect.TimeArg(dbTime(t))
}

// queries holds every statement of the store's table, rendered once.
type queries struct {
	insert, selectForClaim, selectOne, finish, takeOver, extendLease       stmt
	selectPending, selectStale, unfinishedStats, oldestExpired, purge, del stmt
	clock                                                                  stmt
	createMigrations, migrationsExist, selectMigrations, selectMigration   stmt
	insertMigration, deleteMigration, dropMigrations, lockMigrations       stmt
	unlockMigrations, missingTables                                        stmt
	resultLimit                                                            stmt

	listRecords, selectKeys, countByOperation, oldestPending, oldestExpiredLease stmt
	listRecordsBy                                                                map[ListOrder]stmt
	countByUpdated                                                               stmt
	countPurgeable, oldestCreated, selectForUpdate, resolve, forget              stmt
	insertAudit, updateAuditCount, listAudit                                     stmt
	// keyAt and selectDigest are set when the dialect hashes keys itself
	// (DigestQueries).
	keyAt, selectDigest stmt

	// dialect builds the statements that depend on more than the table
	// (the savepoints, by name).
	dialect Queries
}

func loadQueries(q Queries) (queries, error) {
	var out queries
	var errs []error
	get := func(dst *stmt, name string, src Query) {
		if src.SQL == "" {
			errs = append(errs, fmt.Errorf("%w: dialect query %s is empty", ErrInvalidConfig, name))
		}
		for _, a := range src.Args {
			if a <= 0 || a >= argEnd {
				errs = append(errs, fmt.Errorf("%w: dialect query %s binds unknown %v", ErrInvalidConfig, name, a))
			}
		}
		*dst = stmt(src)
	}
	get(&out.insert, "Insert", q.Insert())
	get(&out.selectForClaim, "SelectForClaim", q.SelectForClaim())
	get(&out.selectOne, "Select", q.Select())
	get(&out.finish, "Finish", q.Finish())
	get(&out.takeOver, "TakeOver", q.TakeOver())
	get(&out.extendLease, "ExtendLease", q.ExtendLease())
	get(&out.selectPending, "SelectPending", q.SelectPending())
	get(&out.selectStale, "SelectStale", q.SelectStale())
	get(&out.unfinishedStats, "UnfinishedStats", q.UnfinishedStats())
	get(&out.oldestExpired, "OldestExpired", q.OldestExpired())
	get(&out.purge, "Purge", q.Purge())
	get(&out.del, "Delete", q.Delete())
	get(&out.clock, "Clock", q.Clock())
	get(&out.resultLimit, "ResultLimit", q.ResultLimit())
	// The savepoint statements are built per savepoint, for its name
	// (Store.WithSavepoint); checked here for one.
	var sp stmt
	get(&sp, "Savepoint", q.Savepoint(savepointName(0)))
	get(&sp, "ReleaseSavepoint", q.ReleaseSavepoint(savepointName(0)))
	get(&sp, "RollbackToSavepoint", q.RollbackToSavepoint(savepointName(0)))
	out.dialect = q
	get(&out.createMigrations, "CreateMigrationsTable", q.CreateMigrationsTable())
	get(&out.migrationsExist, "MigrationsTableExists", q.MigrationsTableExists())
	get(&out.missingTables, "MissingTables", q.MissingTables())
	get(&out.selectMigrations, "SelectMigrations", q.SelectMigrations())
	get(&out.selectMigration, "SelectMigration", q.SelectMigration())
	get(&out.insertMigration, "InsertMigration", q.InsertMigration())
	get(&out.deleteMigration, "DeleteMigration", q.DeleteMigration())
	get(&out.dropMigrations, "DropMigrationsTable", q.DropMigrationsTable())
	get(&out.lockMigrations, "LockMigrations", q.LockMigrations())
	get(&out.unlockMigrations, "UnlockMigrations", q.UnlockMigrations())
	get(&out.listRecords, "ListRecords", q.ListRecords())
	out.listRecordsBy = map[ListOrder]stmt{}
	for _, o := range ListOrders() {
		var st stmt
		get(&st, "ListRecordsBy("+o.String()+")", q.ListRecordsBy(o))
		out.listRecordsBy[o] = st
	}
	get(&out.selectKeys, "SelectKeys", q.SelectKeys())
	get(&out.countByOperation, "CountByOperation", q.CountByOperation())
	get(&out.countByUpdated, "CountByUpdated", q.CountByUpdated())
	get(&out.oldestPending, "OldestPending", q.OldestPending())
	get(&out.oldestExpiredLease, "OldestExpiredLease", q.OldestExpiredLease())
	get(&out.countPurgeable, "CountPurgeable", q.CountPurgeable())
	get(&out.oldestCreated, "OldestCreated", q.OldestCreated())
	get(&out.selectForUpdate, "SelectForUpdate", q.SelectForUpdate())
	get(&out.resolve, "Resolve", q.Resolve())
	get(&out.forget, "Forget", q.Forget())
	get(&out.insertAudit, "InsertAudit", q.InsertAudit())
	get(&out.updateAuditCount, "UpdateAuditCount", q.UpdateAuditCount())
	get(&out.listAudit, "ListAudit", q.ListAudit())
	if dq, ok := q.(DigestQueries); ok {
		get(&out.keyAt, "KeyAt", dq.KeyAt())
		get(&out.selectDigest, "SelectDigest", dq.SelectDigest())
	}
	return out, joinErrs(errs)
}
