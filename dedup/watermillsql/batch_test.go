package watermillsql_test

import (
	"database/sql"
	"testing"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/lib/pq"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/dedup/watermillsql"
)

func rows(offsets ...int64) []wsql.Row {
	out := make([]wsql.Row, len(offsets))
	for i, o := range offsets {
		out[i] = wsql.Row{Offset: o}
	}
	return out
}

// The subscriber passes every fetched row and the last acked one; the
// queue adapters ack all the rows, AckDelivered only those up to it.
func TestAckDeliveredNarrowsTheQueueAdapters(t *testing.T) {
	fetched := rows(11, 12, 13, 14, 15)
	params := wsql.AckMessageQueryParams{Topic: "t", Rows: fetched, LastRow: fetched[1]}

	stock, err := wsql.PostgreSQLQueueOffsetsAdapter{}.AckMessageQuery(params)
	require.NoError(t, err)
	require.Equal(t, pq.Array([]int64{11, 12, 13, 14, 15}), stock.Args[0], "the stock adapter acks undelivered rows")

	q, err := watermillsql.AckDelivered(wsql.PostgreSQLQueueOffsetsAdapter{}).AckMessageQuery(params)
	require.NoError(t, err)
	require.Equal(t, stock.Query, q.Query)
	require.Equal(t, pq.Array([]int64{11, 12}), q.Args[0])

	q, err = watermillsql.AckDelivered(wsql.MySQLQueueOffsetsAdapter{DeleteOnAck: true}).AckMessageQuery(params)
	require.NoError(t, err)
	require.Equal(t, []any{int64(11), int64(12)}, q.Args)
	require.Contains(t, q.Query, "IN (?,?)")

	require.Len(t, fetched, 5, "the subscriber's slice is left alone")

	params.LastRow = fetched[4]
	q, err = watermillsql.AckDelivered(wsql.PostgreSQLQueueOffsetsAdapter{}).AckMessageQuery(params)
	require.NoError(t, err)
	require.Equal(t, pq.Array([]int64{11, 12, 13, 14, 15}), q.Args[0], "a batch delivered whole is acked whole")
}

func TestAckDeliveredLeavesOffsetAdaptersAlone(t *testing.T) {
	fetched := rows(3, 4, 5)
	fetched[1].ExtraData = map[string]any{"transaction_id": wsql.XID8(7)}
	params := wsql.AckMessageQueryParams{Topic: "t", Rows: fetched, LastRow: fetched[1], ConsumerGroup: "g"}
	for _, a := range []wsql.OffsetsAdapter{wsql.DefaultPostgreSQLOffsetsAdapter{}, wsql.DefaultMySQLOffsetsAdapter{}} {
		want, err := a.AckMessageQuery(params)
		require.NoError(t, err)
		got, err := watermillsql.AckDelivered(a).AckMessageQuery(params)
		require.NoError(t, err)
		require.Equal(t, want, got, "%T stores the last acked offset already", a)
	}
}

func TestAckDeliveredRefusesAnUnknownLastRow(t *testing.T) {
	params := wsql.AckMessageQueryParams{Topic: "t", Rows: rows(1, 2), LastRow: wsql.Row{Offset: 9}}
	_, err := watermillsql.AckDelivered(wsql.PostgreSQLQueueOffsetsAdapter{}).AckMessageQuery(params)
	require.Error(t, err)
}

func TestAckDeliveredWrapsOnce(t *testing.T) {
	a := watermillsql.AckDelivered(wsql.PostgreSQLQueueOffsetsAdapter{})
	require.Equal(t, a, watermillsql.AckDelivered(a))
}

func TestNewSubscriberNeedsAnOffsetsAdapter(t *testing.T) {
	_, err := watermillsql.NewSubscriber(new(sql.DB), wsql.SubscriberConfig{SchemaAdapter: wsql.PostgreSQLQueueSchema{}}, nil)
	require.ErrorContains(t, err, "OffsetsAdapter")
}
