package natstests

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	wmjs "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/jetstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
)

// drainTimeout bounds how long Close waits for NATS to finish the
// callbacks under way.
const drainTimeout = 20 * time.Second

// drainFirst closes a pkg/jetstream subscriber in the only order that is
// safe.
//
// watermill-nats v2.2.0's jetstream.Subscriber closes the channel it
// delivers on as soon as its Close starts or the context given to
// Subscribe ends, while a NATS callback may still be sending on that
// channel: the race detector reports it, and the send can panic (send on
// closed channel) in a callback goroutine, which ends the process. A
// router's Close does both at once. (Upstream watermill-nats PR #18 is
// open.) TestCloseMidStream hits it in a few rounds.
//
// drainFirst makes both impossible:
//
//   - The subscriber gets a context that never ends (the caller's values,
//     without its cancellation), so only its Close can close the channel.
//     The caller's context ends drainFirst's own output channel instead,
//     which drainFirst alone sends on.
//   - drainFirst owns the subscriber's connection
//     (SubscriberConfig.Conn). Close drains that connection first: NATS
//     stops delivering and waits for every callback under way to return —
//     each gets its ack or nack, and what arrives meanwhile is nacked —
//     and only then lets the subscriber close its channels, when no
//     callback is left to send on them.
//
// A subscription whose context ended before Close stops handing messages
// on and holds the one its callback is sending until Close nacks it
// (JetStream redelivers it after AckWait if Close never comes). Nothing
// is dropped without an ack or a nack, and a redelivery is a duplicate for
// the inbox.
type drainFirst struct {
	nc     *nats.Conn
	closed chan struct{} // the connection's ClosedHandler ran
	sub    *wmjs.Subscriber

	stopping chan struct{} // closed when Close starts
	forwards sync.WaitGroup
	once     sync.Once
	err      error
}

func newDrainFirst(url string, cfg wmjs.SubscriberConfig) (*drainFirst, error) {
	d := &drainFirst{closed: make(chan struct{}), stopping: make(chan struct{})}
	nc, err := nats.Connect(url, nats.ClosedHandler(func(*nats.Conn) { close(d.closed) }),
		nats.DrainTimeout(drainTimeout))
	if err != nil {
		return nil, err
	}
	cfg.Conn = nc
	d.nc = nc
	if d.sub, err = wmjs.NewSubscriber(cfg); err != nil {
		nc.Close()
		return nil, err
	}
	return d, nil
}

// Subscribe hands on what the subscriber delivers until ctx ends or Close
// starts, then closes its channel. What arrives after Close started is
// nacked, so that the callbacks the drain waits for return.
func (d *drainFirst) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	select {
	case <-d.stopping:
		return nil, errors.New("drainFirst: subscriber closed")
	default:
	}
	in, err := d.sub.Subscribe(context.WithoutCancel(ctx), topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	d.forwards.Add(1)
	go func() {
		defer d.forwards.Done()
		d.forward(ctx, in, out)
	}()
	return out, nil
}

// forward sends what in delivers on out until ctx ends or Close starts,
// and closes out. After Close started it nacks what in still delivers
// until the subscriber closes in.
func (d *drainFirst) forward(ctx context.Context, in <-chan *message.Message, out chan<- *message.Message) {
	nack := func() {
		for m := range in {
			m.Nack()
		}
	}
	for {
		select {
		case m, ok := <-in:
			if !ok {
				close(out)
				return
			}
			select {
			case out <- m:
				continue
			case <-ctx.Done():
				m.Nack()
			case <-d.stopping:
				m.Nack()
			}
		case <-ctx.Done():
		case <-d.stopping:
		}
		close(out)
		<-d.stopping // a callback waits on in until Close
		nack()
		return
	}
}

// Close drains the connection, then closes the subscriber and waits for
// the subscriptions' goroutines. When the drain times out a callback may
// still be running: the subscriber is then left open (its goroutines with
// it) rather than made to close a channel the callback may send on.
func (d *drainFirst) Close() error {
	d.once.Do(func() {
		close(d.stopping)
		if err := d.nc.Drain(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			d.err = fmt.Errorf("drainFirst: drain: %w", err)
			return
		}
		select {
		case <-d.closed:
		case <-time.After(drainTimeout + 10*time.Second):
			d.err = fmt.Errorf("drainFirst: the NATS connection did not close within %s of its drain", drainTimeout+10*time.Second)
			return
		}
		if err := d.nc.LastError(); errors.Is(err, nats.ErrDrainTimeout) {
			d.err = fmt.Errorf("drainFirst: callbacks still running after %s; the subscriber is left open: %w", drainTimeout, err)
			return
		}
		// The connection is closed now, so the subscriber's own drain
		// fails; what matters is that it closes its channels, which no
		// callback sends on any more.
		_ = d.sub.Close()
		d.forwards.Wait()
	})
	return d.err
}
