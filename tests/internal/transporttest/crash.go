package transporttest

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const (
	crashEvents = 150
	// dieAfter is how many times a dying consumer reaches its kill point
	// first: a tenth of what it gets, so that it dies mid-stream.
	dieAfter = 10
)

// Crash is the scenario every transport runs. A producer publishes 150
// events, 30% of them twice (a message resent with its UUID, or rebuilt
// with a new one), and every copy must be on the broker before anyone
// consumes. Two consumer processes of one group start on it: a SIGKILLs
// itself with an effect written and not recorded (in reserve mode: made,
// with the lease held), b with its outcome committed and the message not
// acked, each at its tenth execution, which b reaches at the latest once a
// is gone. Then a and b are restarted, as a supervisor would, with a third
// member c, and the broker redelivers what the dead held, in its own time.
// When every event has its effect and nothing is left unacked, the
// survivors stop on SIGTERM and one more consumer drains what their
// shutdown gave back.
//
// Then: exactly one effect row and one completed inbox record per event;
// the message a died on was redelivered, and its effect is someone else's
// (transactional: a's transaction rolled back) or a's own, found by the
// attempt that took the lease over (reserve); the message b died on came
// back and was acked as a duplicate; every message was acked by someone;
// and every execution the consumers reported is an effect in the table.
func Crash(t *testing.T, tr Transport, o Options) {
	start := time.Now()
	e := Setup(t, tr, o)
	msgs, events := Stream(crashEvents, 0.3, 7)
	e.Publish(msgs...)
	e.WaitFor("every message, retries included, on the broker", func() (bool, error) {
		n, err := e.Backlog()
		return n == len(msgs), err
	})

	dying := func(name string, p Point) Spec {
		s := e.Spec(name)
		s.DieAt, s.DieAfter = p, dieAfter
		return s
	}
	a := e.Start(dying("a", AfterEffect))
	b := e.Start(dying("b", AfterCommit))
	dieA, dieB := e.WaitKilled(a), e.WaitKilled(b)
	a2, b2, c := e.Start(e.Spec("a2")), e.Start(e.Spec("b2")), e.Start(e.Spec("c"))
	// Every record completed, not only every effect made: in reserve mode
	// a's effect exists while its intent waits for the takeover.
	e.WaitFor("every event completed and nothing left unacked", func() (bool, error) {
		n, err := e.Completed()
		if err != nil || n < len(events) {
			return false, err
		}
		left, err := e.Backlog()
		return left == 0, err
	})
	e.Stop(c, a2, b2)
	drained := e.Drain()

	by := e.RequireOnce(events)
	require.Zero(t, drained.Executed, "the drain ran a handler: an effect was still missing")
	lines := e.Lines()

	// a: the effect it made never counted.
	fa := by[dieA.Event][0]
	if o.Mode == Reserve {
		require.Equal(t, Effect{EventID: dieA.Event, Seq: fa.Seq, Consumer: "a", Attempt: 1}, fa,
			"a made the effect before it died; nobody made it again")
		rec := e.Record(dieA.Event, events[dieA.Event])
		require.GreaterOrEqual(t, rec.Attempt, int64(2), "an attempt after a's took the expired lease over")
		require.True(t, hasLine(lines, func(l Line) bool {
			return l.Word == WordExec && l.Event == dieA.Event && l.Found && l.Consumer != "a"
		}), "the takeover found a's effect and recorded it")
	} else {
		require.NotEqual(t, "a", fa.Consumer, "a's transaction rolled back when it died")
	}
	requireAckedLater(t, lines, dieA)
	// b: committed, never acked; the redelivery found the record.
	require.Equal(t, "b", by[dieB.Event][0].Consumer, "b committed the effect before it died")
	require.True(t, hasLine(lines, func(l Line) bool {
		return l.Word == WordDup && l.Seq == dieB.Seq && l.Consumer != "b" && l.At.After(dieB.At)
	}), "the message b died on (seq %d) came back and was acked as a duplicate", dieB.Seq)

	acked := map[int]bool{}
	for _, l := range lines {
		if l.Word == WordExec || l.Word == WordDup {
			acked[l.Seq] = true
		}
	}
	for seq := 1; seq <= len(msgs); seq++ {
		require.True(t, acked[seq], "message seq %d was never acked", seq)
	}
	execs, dups, found := 0, 0, 0
	for _, l := range lines {
		switch l.Word {
		case WordExec:
			execs++
			if l.Found {
				found++
			}
		case WordDup:
			dups++
		}
	}
	// b's committed execution reported DIE, not EXEC.
	require.Equal(t, len(events)-1, execs, "executions reported besides b's last")
	if o.Mode == Reserve {
		require.Equal(t, 1, found, "only a's effect was found made by an earlier attempt")
	} else {
		require.Zero(t, found)
	}
	t.Logf("%s/%s/%s: %d messages for %d events on the wire; a died %s at seq %d, b %s at seq %d, both "+
		"redelivered; %d executions, %d duplicates acked, %d acked more than once, %d in-flight nacks; %v",
		tr.Name(), o.DB, o.Mode, len(msgs), len(events), dieA.Point, dieA.Seq, dieB.Point, dieB.Seq,
		execs, dups, execs+dups-len(msgs), count(lines, WordInFlight), time.Since(start).Round(time.Millisecond))
}

// requireAckedLater requires the message a consumer died on to have been
// acked afterwards by another one: the broker handed it out again.
func requireAckedLater(t *testing.T, lines []Line, die Line) {
	t.Helper()
	require.True(t, hasLine(lines, func(l Line) bool {
		return (l.Word == WordExec || l.Word == WordDup) && l.Seq == die.Seq && l.Consumer != die.Consumer &&
			l.At.After(die.At)
	}), "the message %s died on (seq %d) was never acked by another consumer:\n%s", die.Consumer, die.Seq,
		fmt.Sprint(Of(lines, die.Seq)))
}

func hasLine(lines []Line, f func(Line) bool) bool {
	for _, l := range lines {
		if f(l) {
			return true
		}
	}
	return false
}

func count(lines []Line, word string) int {
	n := 0
	for _, l := range lines {
		if l.Word == word {
			n++
		}
	}
	return n
}
