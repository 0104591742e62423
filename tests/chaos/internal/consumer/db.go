package consumer

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"strconv"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"

	"github.com/inboxmill/inboxmill/inbox"
	imysql "github.com/inboxmill/inboxmill/inbox/mysql"
	"github.com/inboxmill/inboxmill/inbox/postgres"
	"github.com/inboxmill/inboxmill/tests/chaos/internal/wire"
)

// openDB opens the consumer's database. PostgreSQL connections carry the
// -app name as application_name, by which the driver finds and terminates
// them. MariaDB shows no connection attribute without performance_schema,
// so every MySQL connection reports its CONNECTION_ID() to the driver
// (wire.LineConn) as it opens, and the driver KILLs those.
func openDB(cfg config, out *lines) (*sql.DB, inbox.Dialect, error) {
	if cfg.db == wire.MySQL {
		mc, err := mysql.ParseDSN(cfg.dsn)
		if err != nil {
			return nil, nil, err
		}
		conn, err := mysql.NewConnector(mc)
		if err != nil {
			return nil, nil, err
		}
		return sql.OpenDB(reportingConnector{Connector: conn, out: out}), imysql.Dialect(), nil
	}
	dsn, err := wire.WithApplicationName(cfg.dsn, cfg.app)
	if err != nil {
		return nil, nil, err
	}
	db, err := sql.Open("pgx", dsn)
	if cfg.partitioned {
		return db, postgres.Partitioned(postgres.Partitions{}), err
	}
	return db, postgres.Dialect(), err
}

// reportingConnector prints the server's ID of every connection it opens.
type reportingConnector struct {
	driver.Connector
	out *lines
}

func (c reportingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	q, ok := conn.(driver.QueryerContext)
	if !ok {
		return conn, nil
	}
	rows, err := q.QueryContext(ctx, "SELECT CONNECTION_ID()", nil)
	if err != nil {
		// The connection is unusable; database/sql retries with a new one.
		_ = conn.Close()
		return nil, driver.ErrBadConn
	}
	defer rows.Close()
	dest := make([]driver.Value, 1)
	if rows.Next(dest) == nil {
		switch v := dest[0].(type) {
		case int64:
			c.out.println(wire.LineConn, v)
		case uint64:
			c.out.println(wire.LineConn, v)
		case []byte:
			if id, err := strconv.ParseInt(string(v), 10, 64); err == nil {
				c.out.println(wire.LineConn, id)
			}
		default:
			c.out.println(wire.LineConn, fmt.Sprint(v))
		}
	}
	return conn, nil
}
