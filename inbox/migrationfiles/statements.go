package migrationfiles

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/inboxmill/inboxmill/inbox"
)

// gooseEndsStatement tells whether goose, outside a StatementBegin block,
// ends a statement at this line: when the last word before a word that
// starts a "--" comment ends with a semicolon.
func gooseEndsStatement(line string) bool {
	last := ""
	for word := range strings.FieldsSeq(line) {
		if strings.HasPrefix(word, "--") {
			break
		}
		last = word
	}
	return strings.HasSuffix(last, ";")
}

// gooseSplitsAlike tells whether goose, splitting stmt (terminated by a
// semicolon) on its own, finds exactly that one statement: only its last
// line may end a statement by goose's rule, and that line must.
func gooseSplitsAlike(stmt string) bool {
	lines := strings.Split(stmt+";", "\n")
	for i, line := range lines {
		if gooseEndsStatement(line) != (i == len(lines)-1) {
			return false
		}
	}
	return true
}

// name is what a migration's name may be here: it is written into SQL as
// a string literal and into file names.
var name = regexp.MustCompile(`^[a-z0-9_]+$`)

// identifier is the rule inbox.Config.Table states: a plain identifier of
// at most inbox.MaxTableLen bytes.
var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func checkTable(table string) error {
	if len(table) > inbox.MaxTableLen {
		return fmt.Errorf("%w: table name is %d bytes, more than %d", inbox.ErrInvalidConfig, len(table), inbox.MaxTableLen)
	}
	if !identifier.MatchString(table) {
		return fmt.Errorf("%w: table name %q is not a plain identifier ([A-Za-z_][A-Za-z0-9_]*)", inbox.ErrInvalidConfig, table)
	}
	return nil
}

// recorder writes the statements that keep "<table>_migrations" as
// Store.Migrate keeps it, from the dialect's own queries with the
// arguments written in as literals.
type recorder struct {
	d     inbox.Dialect
	q     inbox.Queries
	now   string // SQL for the current time, as applied_at stores it
	first int    // the lowest version: undoing it drops the table
}

func newRecorder(d inbox.Dialect, table string, first int) (*recorder, error) {
	now, err := nowSQL(d, table)
	if err != nil {
		return nil, err
	}
	return &recorder{d: d, q: d.Queries(table), now: now, first: first}, nil
}

// nowSQL is the current time as the dialect binds it for a time column
// (Dialect.TimeArg): a timestamp, or integer microseconds since the epoch,
// which the dialect's Clock query reads.
func nowSQL(d inbox.Dialect, table string) (string, error) {
	const probe = 1_234_567
	switch v := d.TimeArg(time.UnixMicro(probe)).(type) {
	case time.Time:
		if d.Name() == "mysql" {
			// CURRENT_TIMESTAMP is in the session's time zone; the store
			// writes UTC.
			return "UTC_TIMESTAMP(6)", nil
		}
		return "CURRENT_TIMESTAMP", nil
	case int64:
		if v == probe {
			return "(" + d.Queries(table).Clock().SQL + ")", nil
		}
	}
	return "", fmt.Errorf("migrationfiles: dialect %s: times are bound as neither time.Time nor microseconds; cannot write applied_at", d.Name())
}

// up returns the statements that record m as applied, after its own.
func (r *recorder) up(m inbox.Migration) ([]string, error) {
	del, err := r.bind(r.q.DeleteMigration(), m)
	if err != nil {
		return nil, err
	}
	ins, err := r.bind(r.q.InsertMigration(), m)
	if err != nil {
		return nil, err
	}
	// Deleting first makes the file safe to run where Store.Migrate
	// recorded the version already.
	return []string{r.q.CreateMigrationsTable().SQL, del, ins}, nil
}

// down returns the statement that forgets m, before its own; and, for the
// first version, the one dropping the table, after its own.
func (r *recorder) down(m inbox.Migration) (before, after []string, err error) {
	del, err := r.bind(r.q.DeleteMigration(), m)
	if err != nil {
		return nil, nil, err
	}
	if m.Version == r.first {
		after = []string{r.q.DropMigrationsTable().SQL}
	}
	return []string{del}, after, nil
}

// bind writes q's arguments into its SQL as literals.
func (r *recorder) bind(q inbox.Query, m inbox.Migration) (string, error) {
	lits := make([]string, len(q.Args))
	for i, a := range q.Args {
		switch a {
		case inbox.ArgVersion:
			lits[i] = strconv.Itoa(m.Version)
		case inbox.ArgName:
			lits[i] = "'" + m.Name + "'" // checked against name
		case inbox.ArgNow:
			lits[i] = r.now
		default:
			return "", fmt.Errorf("migrationfiles: dialect %s: a migrations query binds %v, which a file cannot", r.d.Name(), a)
		}
	}
	sql := q.SQL
	if p := r.d.Placeholder(1); p == r.d.Placeholder(2) {
		// One placeholder for every position ("?"): each in turn.
		parts := strings.Split(sql, p)
		if len(parts) != len(lits)+1 {
			return "", fmt.Errorf("migrationfiles: dialect %s: %q has %d placeholders for %d arguments", r.d.Name(), sql, len(parts)-1, len(lits))
		}
		var b strings.Builder
		for i, part := range parts {
			b.WriteString(part)
			if i < len(lits) {
				b.WriteString(lits[i])
			}
		}
		return b.String(), nil
	}
	// Numbered placeholders ("$1"): the highest first, so that $1 is not
	// taken for the start of $10.
	for n := len(lits); n >= 1; n-- {
		p := r.d.Placeholder(n)
		if !strings.Contains(sql, p) {
			return "", fmt.Errorf("migrationfiles: dialect %s: %q lacks placeholder %s", r.d.Name(), sql, p)
		}
		sql = strings.ReplaceAll(sql, p, lits[n-1])
	}
	return sql, nil
}
