package inbox

import (
	"database/sql"
	"fmt"
	"time"
)

// timeCol scans a time column whatever the driver hands back: time.Time
// (pq, pgx, MySQL with parseTime=true), text (MySQL without parseTime) or
// integer microseconds (SQLite). NULL becomes the zero time.
type timeCol struct{ t *time.Time }

func (c timeCol) Scan(v any) error {
	switch v := v.(type) {
	case nil:
		*c.t = time.Time{}
	case time.Time:
		*c.t = v.UTC()
	case int64:
		*c.t = time.UnixMicro(v).UTC()
	case []byte:
		return c.parse(string(v))
	case string:
		return c.parse(v)
	default:
		return fmt.Errorf("inbox: cannot scan %T into a time", v)
	}
	return nil
}

func (c timeCol) parse(s string) error {
	for _, layout := range []string{"2006-01-02 15:04:05.999999999", time.RFC3339Nano} {
		if t, err := time.ParseInLocation(layout, s, time.UTC); err == nil {
			*c.t = t.UTC()
			return nil
		}
	}
	return fmt.Errorf("inbox: cannot parse time %q", s)
}

// scanRecord reads the columns listed in Queries.Select.
func scanRecord(row interface{ Scan(...any) error }) (*Record, error) {
	var (
		r                                          Record
		status                                     string
		leaseOwner, resourceID, corrID, extRef, ee sql.NullString
	)
	err := row.Scan(&r.Scope, &r.Operation, &r.Key, &r.PayloadHash, &status, &r.Attempt, &leaseOwner,
		timeCol{&r.LeaseUntil}, &r.Result, &resourceID, &corrID, &extRef, &ee,
		timeCol{&r.CreatedAt}, timeCol{&r.UpdatedAt}, timeCol{&r.ExpiresAt})
	if err != nil {
		return nil, err
	}
	r.Status = Status(status)
	r.LeaseOwner = leaseOwner.String
	r.ResourceID = resourceID.String
	r.CorrelationID = corrID.String
	r.ExternalRef = extRef.String
	r.Error = ee.String
	return &r, nil
}
