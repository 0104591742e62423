package migrationfiles_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"sort"
	"testing"

	"ariga.io/atlas/sql/migrate"
	atlasmysql "ariga.io/atlas/sql/mysql"
	atlaspostgres "ariga.io/atlas/sql/postgres"
	atlassqlite "ariga.io/atlas/sql/sqlite"
	gomigrate "github.com/golang-migrate/migrate/v4"
	"github.com/golang-migrate/migrate/v4/database"
	gmmysql "github.com/golang-migrate/migrate/v4/database/mysql"
	gmpostgres "github.com/golang-migrate/migrate/v4/database/postgres"
	gmsqlite "github.com/golang-migrate/migrate/v4/database/sqlite"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox/migrationfiles"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

// runner drives one tool over a directory of rendered files.
type runner interface {
	// up applies every version.
	up(ctx context.Context) error
	// downTo undoes every version above the inbox version v (0: all).
	downTo(ctx context.Context, v int) error
	close() error
}

// tool is one migration tool and the format it reads.
type tool struct {
	name   string
	format migrationfiles.Format
	open   func(t *testing.T, b *bundle, dir string) runner
	// down is false for a tool that plans its downs itself (Atlas).
	down bool
}

var tools = []tool{
	{name: "goose", format: migrationfiles.FormatGoose, open: openGoose, down: true},
	{name: "golang-migrate", format: migrationfiles.FormatGolangMigrate, open: openGolangMigrate, down: true},
	{name: "atlas", format: migrationfiles.FormatAtlas, open: openAtlas},
}

// TestToolsRoundTrip renders the files for each tool and database, has
// the tool apply them, undo them and apply them again (and undo down to
// the first version and back), and checks after every step that the
// table is what Store.Migrate (or MigrateTo) makes of it, that Validate
// agrees, and that the store works on it. The shipped migrations run,
// and so do they with one test-only version more (extend).
func TestToolsRoundTrip(t *testing.T) {
	for _, tl := range tools {
		for _, kind := range kinds {
			for _, variant := range []string{"shipped", "extended"} {
				t.Run(tl.name+"/"+string(kind)+"/"+variant, func(t *testing.T) {
					t.Parallel()
					d := testdb.Dialect(kind)
					if variant == "extended" {
						d = extend(t, d)
					}
					b := setup(t, kind, d)
					ctx := context.Background()
					want := b.reference(t, 0)
					vs := b.versions(t)
					atFirst := b.reference(t, vs[0])

					dir := t.TempDir()
					_, err := migrationfiles.Write(dir, d, b.table, tl.format)
					require.NoError(t, err)
					r := tl.open(t, b, dir)

					require.NoError(t, r.up(ctx), "up")
					b.checkApplied(t, want)
					require.NoError(t, r.up(ctx), "up again changes nothing")
					require.Equal(t, want, snapshot(t, b.db, kind, b.table))
					if !tl.down {
						return
					}

					require.NoError(t, r.downTo(ctx, 0), "down")
					b.checkUndone(t)
					require.NoError(t, r.up(ctx), "up after down")
					b.checkApplied(t, want)

					if len(vs) > 1 {
						require.NoError(t, r.downTo(ctx, vs[0]), "down to the first version")
						b.checkAtFirst(t, atFirst)
						require.NoError(t, r.up(ctx), "up from the first version")
						require.Equal(t, want, snapshot(t, b.db, kind, b.table))
					}
					require.NoError(t, r.downTo(ctx, 0), "down at the end")
					b.checkUndone(t)
					require.NoError(t, r.close())
				})
			}
		}
	}
}

// TestToolsTakeOverAStoreMigratedTable checks what the package
// documentation promises: files run by a tool over a table Store.Migrate
// created change nothing and record every version once.
func TestToolsTakeOverAStoreMigratedTable(t *testing.T) {
	for _, tl := range tools {
		if tl.format == migrationfiles.FormatAtlas {
			continue // Atlas adopts a schema with a baseline, not by running files again
		}
		for _, kind := range kinds {
			t.Run(tl.name+"/"+string(kind), func(t *testing.T) {
				t.Parallel()
				d := testdb.Dialect(kind)
				b := setup(t, kind, d)
				ctx := context.Background()
				want := b.reference(t, 0)
				require.NoError(t, b.store(t).Migrate(ctx))
				require.Equal(t, want, snapshot(t, b.db, kind, b.table))

				dir := t.TempDir()
				_, err := migrationfiles.Write(dir, d, b.table, tl.format)
				require.NoError(t, err)
				r := tl.open(t, b, dir)
				require.NoError(t, r.up(ctx))
				b.checkApplied(t, want)
				require.NoError(t, r.downTo(ctx, 0))
				b.checkUndone(t)
				require.NoError(t, r.close())
			})
		}
	}
}

// TestGolangMigrateMySQLNeedsOneStatementPerFile shows why the
// golang-migrate files differ from the plain ones on MySQL: without
// multiStatements=true golang-migrate fails on a file of several
// statements and leaves the database dirty, where the golang-migrate
// files pass on the same connection settings.
func TestGolangMigrateMySQLNeedsOneStatementPerFile(t *testing.T) {
	t.Parallel()
	b := setup(t, testdb.MySQL, testdb.Dialect(testdb.MySQL))
	ctx := context.Background()

	plain := t.TempDir()
	_, err := migrationfiles.Write(plain, b.d, b.table, migrationfiles.FormatSQL)
	require.NoError(t, err)
	r := openGolangMigrate(t, b, plain).(*golangMigrate)
	err = r.up(ctx)
	require.Error(t, err, "several statements in one file without multiStatements")
	require.Contains(t, err.Error(), "1064", "a syntax error: the server saw several statements")
	_, dirty, verr := r.m.Version()
	require.NoError(t, verr)
	require.True(t, dirty)
	require.NoError(t, r.close())
	_, err = b.db.ExecContext(ctx, "DROP TABLE IF EXISTS gm_"+b.table)
	require.NoError(t, err)

	files := t.TempDir()
	_, err = migrationfiles.Write(files, b.d, b.table, migrationfiles.FormatGolangMigrate)
	require.NoError(t, err)
	r = openGolangMigrate(t, b, files).(*golangMigrate)
	require.NoError(t, r.up(ctx))
	b.checkApplied(t, b.reference(t, 0))
	v, dirty, err := r.m.Version()
	require.NoError(t, err)
	require.False(t, dirty)
	vs := b.versions(t)
	require.Equal(t, uint(10*vs[len(vs)-1]+3), v, "version v is complete at 10v+3")
	require.NoError(t, r.downTo(ctx, 0))
	require.NoError(t, r.close())
}

// goose, through its Provider API, with a version table of its own.
type gooseRunner struct{ p *goose.Provider }

func openGoose(t *testing.T, b *bundle, dir string) runner {
	t.Helper()
	dialect := map[testdb.Kind]goose.Dialect{
		testdb.SQLite: goose.DialectSQLite3, testdb.PostgresPQ: goose.DialectPostgres, testdb.MySQL: goose.DialectMySQL,
	}[b.kind]
	p, err := goose.NewProvider(dialect, b.toolDB(t), os.DirFS(dir), goose.WithTableName("goose_"+b.table),
		goose.WithDisableGlobalRegistry(true))
	require.NoError(t, err)
	return gooseRunner{p}
}

func (g gooseRunner) up(ctx context.Context) error {
	_, err := g.p.Up(ctx)
	return err
}

func (g gooseRunner) downTo(ctx context.Context, v int) error {
	_, err := g.p.DownTo(ctx, int64(v))
	return err
}

func (g gooseRunner) close() error { return g.p.Close() }

// golang-migrate, with its driver over a connection pool of its own and a
// version table of its own.
type golangMigrate struct {
	m     *gomigrate.Migrate
	steps bool // MySQL: inbox version v is golang-migrate version 10v+3
}

func openGolangMigrate(t *testing.T, b *bundle, dir string) runner {
	t.Helper()
	src, err := iofs.New(os.DirFS(dir), ".")
	require.NoError(t, err)
	db := b.toolDB(t)
	var drv database.Driver
	switch b.kind {
	case testdb.SQLite:
		drv, err = gmsqlite.WithInstance(db, &gmsqlite.Config{MigrationsTable: "gm_" + b.table})
	case testdb.MySQL:
		drv, err = gmmysql.WithInstance(db, &gmmysql.Config{MigrationsTable: "gm_" + b.table})
	default:
		drv, err = gmpostgres.WithInstance(db, &gmpostgres.Config{MigrationsTable: "gm_" + b.table})
	}
	require.NoError(t, err)
	m, err := gomigrate.NewWithInstance("iofs", src, string(b.kind), drv)
	require.NoError(t, err)
	return &golangMigrate{m: m, steps: b.kind == testdb.MySQL}
}

func (g *golangMigrate) up(context.Context) error {
	if err := g.m.Up(); err != nil && !errors.Is(err, gomigrate.ErrNoChange) {
		return err
	}
	return nil
}

func (g *golangMigrate) downTo(_ context.Context, v int) error {
	var err error
	switch {
	case v == 0:
		err = g.m.Down()
	case g.steps:
		err = g.m.Migrate(uint(10*v + 3))
	default:
		err = g.m.Migrate(uint(v))
	}
	if errors.Is(err, gomigrate.ErrNoChange) {
		return nil
	}
	return err
}

func (g *golangMigrate) close() error {
	serr, derr := g.m.Close()
	return errors.Join(serr, derr)
}

// atlasRunner applies the directory the way `atlas migrate apply` does in
// its default --tx-mode file: the library's executor, one transaction per
// file, the revisions kept in memory.
type atlasRunner struct {
	kind testdb.Kind
	db   *sql.DB
	dir  *migrate.LocalDir
	revs *revisions
}

func openAtlas(t *testing.T, b *bundle, dir string) runner {
	t.Helper()
	d, err := migrate.NewLocalDir(dir)
	require.NoError(t, err)
	require.NoError(t, migrate.Validate(d), "atlas.sum is what Atlas computes")
	return &atlasRunner{kind: b.kind, db: b.toolDB(t), dir: d, revs: &revisions{}}
}

func (a *atlasRunner) driver(q interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}) (migrate.Driver, error) {
	var drv migrate.Driver
	var err error
	switch a.kind {
	case testdb.SQLite:
		drv, err = atlassqlite.Open(q)
	case testdb.MySQL:
		drv, err = atlasmysql.Open(q)
	default:
		drv, err = atlaspostgres.Open(q)
	}
	if err != nil {
		return nil, err
	}
	if sc, ok := drv.(migrate.StmtScanner); ok {
		// The dialect splits statements its own way (SQLite's trigger
		// bodies): keep that visible through the wrapper.
		return scanningDirtyDriver{dirtyDriver{drv}, sc}, nil
	}
	return dirtyDriver{drv}, nil
}

// dirtyDriver answers Atlas's clean check without inspecting the
// database. The shared test database is never clean, so with allow-dirty
// the check's only possible outcome is "go on"; but its inspection reads
// the catalog of every table in the schema, which other test packages
// create and drop at the same moment, and fails on a table that vanishes
// halfway ("column was not found for index").
type dirtyDriver struct{ migrate.Driver }

func (dirtyDriver) CheckClean(context.Context, *migrate.TableIdent) error {
	return &migrate.NotCleanError{Reason: "the shared test database holds other tables"}
}

type scanningDirtyDriver struct {
	dirtyDriver
	migrate.StmtScanner
}

func (a *atlasRunner) up(ctx context.Context) error {
	drv, err := a.driver(a.db)
	if err != nil {
		return err
	}
	// The shared test database holds other tables: not clean.
	ex, err := migrate.NewExecutor(drv, a.dir, a.revs, migrate.WithAllowDirty(true))
	if err != nil {
		return err
	}
	pending, err := ex.Pending(ctx)
	if errors.Is(err, migrate.ErrNoPendingFiles) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, f := range pending {
		if err := a.execute(ctx, f); err != nil {
			return err
		}
	}
	return nil
}

func (a *atlasRunner) execute(ctx context.Context, f migrate.File) (err error) {
	tx, err := a.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	drv, err := a.driver(tx)
	if err != nil {
		return err
	}
	ex, err := migrate.NewExecutor(drv, a.dir, a.revs, migrate.WithAllowDirty(true))
	if err != nil {
		return err
	}
	if err := ex.Execute(ctx, f); err != nil {
		return err
	}
	return tx.Commit()
}

func (a *atlasRunner) downTo(context.Context, int) error {
	return errors.New("atlas plans downs itself; the directory has none")
}

func (a *atlasRunner) close() error { return a.db.Close() }

// revisions is an in-memory migrate.RevisionReadWriter.
type revisions struct{ rs []*migrate.Revision }

func (r *revisions) Ident() *migrate.TableIdent {
	return &migrate.TableIdent{Name: "atlas_schema_revisions"}
}

func (r *revisions) ReadRevisions(context.Context) ([]*migrate.Revision, error) {
	out := append([]*migrate.Revision(nil), r.rs...)
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

func (r *revisions) ReadRevision(_ context.Context, v string) (*migrate.Revision, error) {
	for _, rev := range r.rs {
		if rev.Version == v {
			return rev, nil
		}
	}
	return nil, migrate.ErrRevisionNotExist
}

func (r *revisions) WriteRevision(_ context.Context, rev *migrate.Revision) error {
	for i, have := range r.rs {
		if have.Version == rev.Version {
			r.rs[i] = rev
			return nil
		}
	}
	r.rs = append(r.rs, rev)
	return nil
}

func (r *revisions) DeleteRevision(_ context.Context, v string) error {
	for i, have := range r.rs {
		if have.Version == v {
			r.rs = append(r.rs[:i], r.rs[i+1:]...)
			return nil
		}
	}
	return nil
}
