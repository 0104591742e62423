package broker

import (
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/inboxmill/inboxmill/tests/chaos/internal/wire"
)

// kfake (v0.0.0-20260918054303-01f206a7e32c, groups.go) keeps a member of
// a classic group for good when the member dies while its JoinGroup waits
// for the rebalance to complete. The join
// response then goes to a closed connection: kfake's group.reply starts the
// member's session timer only after a response it could hand on (and
// joining stopped the timer the member had while pending), so the member
// has none. Its SyncGroup never comes, and the pending-sync deadline that
// would remove it after the rebalance timeout is cleared as soon as the
// leader's SyncGroup makes the group stable (group.completeLeaderSync). The
// dead member keeps the partitions the leader gave it, which no one
// consumes until another member joins or leaves the group. Kafka schedules
// every member's session expiry when the join phase completes, whether or
// not its response arrived, and would have rebalanced after the session
// timeout.
//
// Whether a dead member's response is refused is a coin toss (kfake's
// reply selects between a free slot in the connection's response buffer
// and the connection's end), so the stall came in few runs: a consumer
// SIGKILLed while it was joining, and no membership change afterwards.
//
// evictor does what Kafka would: it notes every group request that names a
// member (JoinGroup, SyncGroup, Heartbeat, OffsetCommit), and removes,
// with a LeaveGroup on its behalf, a member of a stable group that sent
// none for twice its session timeout, the group stable all that time. Live consumers heartbeat every
// 200 ms; one silent that long would have been expired by kfake too, had
// its timer been running. It can go once kfake starts the session timer of
// every member it answers at the end of a join.
type evictor struct {
	addr string
	log  io.Writer

	mu   sync.Mutex
	seen map[memberKey]sighting
	// stable is when each group was first seen stable, this time
	// (sweep's goroutine only). Silence counts from then at the
	// earliest: a member whose SyncGroup waited long for the leader's
	// sends nothing more until it has the answer, when the group is
	// already stable, and must be given the time to heartbeat.
	stable map[string]time.Time
}

type memberKey struct{ group, member string }

type sighting struct {
	at      time.Time
	session time.Duration // from the member's last JoinGroup; 0: not seen joining
}

// unknownSession stands for the session timeout of a member whose
// JoinGroup this process did not see (it joined before a broker restart;
// kfake restores such members with their session timers).
const unknownSession = 15 * time.Second

// sweepEvery is how often the evictor looks at the groups.
const sweepEvery = 250 * time.Millisecond

// watch installs the evictor on c, whose first listener is at addr, until
// stop is closed.
func watch(c *kfake.Cluster, addr string, log io.Writer, stop <-chan struct{}) {
	e := &evictor{addr: addr, log: log, seen: map[memberKey]sighting{}, stable: map[string]time.Time{}}
	for _, key := range []kmsg.Key{kmsg.JoinGroup, kmsg.SyncGroup, kmsg.Heartbeat, kmsg.OffsetCommit} {
		// Observes and lets kfake handle the request (not handled: the
		// control function stays).
		c.ControlKey(int16(key), func(req kmsg.Request) (kmsg.Response, error, bool) {
			e.observe(req)
			return nil, nil, false
		})
	}
	go e.run(stop)
}

func (e *evictor) observe(req kmsg.Request) {
	var (
		k       memberKey
		session time.Duration
	)
	switch r := req.(type) {
	case *kmsg.JoinGroupRequest:
		k, session = memberKey{r.Group, r.MemberID}, time.Duration(r.SessionTimeoutMillis)*time.Millisecond
	case *kmsg.SyncGroupRequest:
		k = memberKey{r.Group, r.MemberID}
	case *kmsg.HeartbeatRequest:
		k = memberKey{r.Group, r.MemberID}
	case *kmsg.OffsetCommitRequest:
		k = memberKey{r.Group, r.MemberID}
	}
	if k.member == "" {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.seen[k]
	s.at = time.Now()
	if session > 0 {
		s.session = session
	}
	e.seen[k] = s
}

func (e *evictor) run(stop <-chan struct{}) {
	t := time.NewTicker(sweepEvery)
	defer t.Stop()
	var b *sarama.Broker
	defer func() {
		if b != nil {
			_ = b.Close()
		}
	}()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if b == nil {
			cfg := sarama.NewConfig()
			cfg.Version = wire.KafkaVersion
			cfg.ClientID = "chaos-broker-evictor"
			b = sarama.NewBroker(e.addr)
			if err := b.Open(cfg); err != nil {
				b = nil
				continue
			}
		}
		if err := e.sweep(b, time.Now()); err != nil {
			_ = b.Close()
			b = nil
		}
	}
}

// sweep removes the silent members of the stable groups; an error is the
// connection's.
func (e *evictor) sweep(b *sarama.Broker, now time.Time) error {
	list, err := b.ListGroups(&sarama.ListGroupsRequest{})
	if err != nil {
		return err
	}
	if len(list.Groups) == 0 {
		return nil
	}
	groups := make([]string, 0, len(list.Groups))
	for g := range list.Groups {
		groups = append(groups, g)
	}
	desc, err := b.DescribeGroups(&sarama.DescribeGroupsRequest{Groups: groups})
	if err != nil {
		return err
	}
	present := map[memberKey]bool{}
	var silent []memberKey
	var silentFor []time.Duration
	listed := map[string]bool{}
	for _, g := range desc.Groups {
		listed[g.GroupId] = true
		if g.State != "Stable" {
			delete(e.stable, g.GroupId)
		} else if _, ok := e.stable[g.GroupId]; !ok {
			e.stable[g.GroupId] = now
		}
	}
	for g := range e.stable {
		if !listed[g] {
			delete(e.stable, g)
		}
	}
	e.mu.Lock()
	for _, g := range desc.Groups {
		for id := range g.Members {
			k := memberKey{g.GroupId, id}
			present[k] = true
			s, ok := e.seen[k]
			if !ok {
				// First sight (this process started after it joined):
				// silent from now on.
				e.seen[k] = sighting{at: now}
				continue
			}
			limit := 2 * s.session
			if s.session == 0 {
				limit = 2 * unknownSession
			}
			since, stable := e.stable[g.GroupId]
			if !stable {
				continue
			}
			if s.at.After(since) {
				since = s.at
			}
			if now.Sub(since) > limit {
				silent = append(silent, k)
				silentFor = append(silentFor, now.Sub(s.at))
			}
		}
	}
	for k, s := range e.seen {
		// Forget members gone from their groups (a minute after their last
		// request, so that one still joining is not forgotten).
		if !present[k] && now.Sub(s.at) > time.Minute {
			delete(e.seen, k)
		}
	}
	e.mu.Unlock()
	for i, k := range silent {
		resp, err := b.LeaveGroup(&sarama.LeaveGroupRequest{GroupId: k.group, MemberId: k.member})
		if err != nil {
			return err
		}
		outcome := "removed"
		if resp.Err != sarama.ErrNoError {
			outcome = "could not remove: " + resp.Err.Error()
		}
		fmt.Fprintf(e.log, "broker: group %s: member %s silent for %v in a stable group: %s\n",
			k.group, k.member, silentFor[i].Round(time.Millisecond), outcome)
		e.mu.Lock()
		delete(e.seen, k)
		e.mu.Unlock()
	}
	return nil
}
