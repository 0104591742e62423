package broker

import (
	"encoding/binary"
	"io"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/inboxmill/inboxmill/tests/chaos/internal/wire"
)

// lockedWriter collects the evictor's log lines.
type lockedWriter struct {
	mu  sync.Mutex
	buf []byte
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	return len(p), nil
}

// TestEvictsMemberThatDiedJoining: a member whose JoinGroup is waiting for
// the rebalance when its connection ends must not stay in the group once
// the group is stable again. kfake keeps it (without a session timer)
// about every other time; the evictor removes it.
func TestEvictsMemberThatDiedJoining(t *testing.T) {
	const (
		group   = "g"
		topic   = "t"
		session = 300 * time.Millisecond
	)
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, topic),
		kfake.GroupMinSessionTimeout(100*time.Millisecond))
	require.NoError(t, err)
	defer c.Close()
	addr := c.ListenAddrs()[0]
	var log lockedWriter
	stop := make(chan struct{})
	defer close(stop)
	watch(c, addr, &log, stop)

	cfg := sarama.NewConfig()
	cfg.Version = wire.KafkaVersion
	dial := func() *sarama.Broker {
		b := sarama.NewBroker(addr)
		require.NoError(t, b.Open(cfg))
		_, err := b.Connected()
		require.NoError(t, err)
		return b
	}
	join := func(b *sarama.Broker, member string) *sarama.JoinGroupResponse {
		req := &sarama.JoinGroupRequest{Version: 5, GroupId: group, SessionTimeout: int32(session / time.Millisecond),
			RebalanceTimeout: 5000, MemberId: member, ProtocolType: "consumer"}
		require.NoError(t, req.AddGroupProtocolMetadata("range", &sarama.ConsumerGroupMemberMetadata{Topics: []string{topic}}))
		resp, err := b.JoinGroup(req)
		require.NoError(t, err)
		return resp
	}
	newMemberID := func() string {
		b := dial()
		defer b.Close()
		resp := join(b, "")
		require.Equal(t, sarama.ErrMemberIdRequired, resp.Err)
		return resp.MemberId
	}

	// The live member: it leads, gives each member a partition, and
	// heartbeats.
	live := dial()
	defer live.Close()
	leader := newMemberID()
	var gen int32
	rejoin := func() {
		resp := join(live, leader)
		require.Equal(t, sarama.ErrNoError, resp.Err)
		require.Equal(t, leader, resp.LeaderId)
		gen = resp.GenerationId
		sync := &sarama.SyncGroupRequest{Version: 3, GroupId: group, GenerationId: gen, MemberId: leader}
		for i, m := range resp.Members {
			require.NoError(t, sync.AddGroupAssignmentMember(m.MemberId,
				&sarama.ConsumerGroupMemberAssignment{Topics: map[string][]int32{topic: {int32(i)}}}))
		}
		s, err := live.SyncGroup(sync)
		require.NoError(t, err)
		require.Equal(t, sarama.ErrNoError, s.Err)
	}
	// ping keeps the live member's session while a rebalance waits for it.
	ping := func() sarama.KError {
		h, err := live.Heartbeat(&sarama.HeartbeatRequest{Version: 3, GroupId: group, GenerationId: gen, MemberId: leader})
		require.NoError(t, err)
		return h.Err
	}
	beat := func() {
		switch err := ping(); err {
		case sarama.ErrRebalanceInProgress:
			rejoin()
		default:
			require.Equal(t, sarama.ErrNoError, err)
		}
	}
	describe := func() (string, []string) {
		d, err := live.DescribeGroups(&sarama.DescribeGroupsRequest{Groups: []string{group}})
		require.NoError(t, err)
		require.Len(t, d.Groups, 1)
		var ids []string
		for id := range d.Groups[0].Members {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		return d.Groups[0].State, ids
	}
	rejoin()

	// Each round a member dies with its JoinGroup waiting; kfake keeps it
	// in about every other round.
	for round := range 8 {
		dead := newMemberID()
		conn, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		sendJoin(t, conn, group, topic, dead, session)
		require.Eventually(t, func() bool {
			ping()
			_, ids := describe()
			return slices.Contains(ids, dead)
		}, 5*time.Second, 20*time.Millisecond, "round %d: the dying member joins", round)
		require.NoError(t, conn.Close())
		time.Sleep(50 * time.Millisecond) // kfake sees the connection end
		rejoin()                          // the rebalance completes with the dead member in it

		deadline := time.Now().Add(10 * session)
		for {
			beat()
			state, ids := describe()
			if state == "Stable" && slices.Equal(ids, []string{leader}) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the group is %s with members %v, after %v; the member that died joining (%s) is still in it",
					round, state, ids, 10*session, dead)
			}
			time.Sleep(session / 6)
		}
	}
	log.mu.Lock()
	t.Logf("evictor:\n%s", log.buf)
	log.mu.Unlock()
}

// sendJoin writes a JoinGroup (v5) for member on conn without waiting for
// the answer, as a consumer that dies while it waits for the rebalance.
func sendJoin(t *testing.T, conn io.Writer, group, topic, member string, session time.Duration) {
	t.Helper()
	meta := kmsg.NewConsumerMemberMetadata()
	meta.Topics = []string{topic}
	proto := kmsg.NewJoinGroupRequestProtocol()
	proto.Name = "range"
	proto.Metadata = meta.AppendTo(nil)
	req := kmsg.NewPtrJoinGroupRequest()
	req.Version = 5
	req.Group = group
	req.SessionTimeoutMillis = int32(session / time.Millisecond)
	req.RebalanceTimeoutMillis = 5000
	req.MemberID = member
	req.ProtocolType = "consumer"
	req.Protocols = append(req.Protocols, proto)

	const clientID = "dying"
	// Request header v1: API key, version, correlation ID, client ID.
	msg := binary.BigEndian.AppendUint16(nil, uint16(req.Key()))
	msg = binary.BigEndian.AppendUint16(msg, uint16(req.Version))
	msg = binary.BigEndian.AppendUint32(msg, 1)
	msg = binary.BigEndian.AppendUint16(msg, uint16(len(clientID)))
	msg = append(msg, clientID...)
	msg = req.AppendTo(msg)
	frame := binary.BigEndian.AppendUint32(nil, uint32(len(msg)))
	_, err := conn.Write(append(frame, msg...))
	require.NoError(t, err)
}
