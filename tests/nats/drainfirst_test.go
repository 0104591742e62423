package natstests

import (
	"context"
	"errors"
	"sync"
	"time"

	wmjs "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/jetstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
)

// drainFirst closes a pkg/jetstream subscriber in the order that is safe.
//
// watermill-nats v2.2.0's jetstream.Subscriber.Close closes the channel it
// delivers on while a NATS callback may still be sending to it (the race
// detector reports it; upstream watermill-nats PR #18 is open), which can
// panic with a send on a closed channel. drainFirst owns the subscriber's
// connection: Close drains it first — NATS stops delivering and waits for
// every callback to return, nacking what arrives meanwhile — and only then
// lets the subscriber close its channel.
type drainFirst struct {
	nc     *nats.Conn
	closed chan struct{} // the connection's ClosedHandler ran
	sub    *wmjs.Subscriber

	mu       sync.Mutex
	stopping chan struct{}
	forwards sync.WaitGroup
	once     sync.Once
	err      error
}

func newDrainFirst(url string, cfg wmjs.SubscriberConfig) (*drainFirst, error) {
	d := &drainFirst{closed: make(chan struct{}), stopping: make(chan struct{})}
	nc, err := nats.Connect(url, nats.ClosedHandler(func(*nats.Conn) { close(d.closed) }),
		nats.DrainTimeout(20*time.Second))
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

// Subscribe hands on what the subscriber delivers until Close starts;
// after that it nacks, so that the callbacks the drain waits for return.
func (d *drainFirst) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	in, err := d.sub.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	d.forwards.Add(1)
	go func() {
		defer d.forwards.Done()
		defer close(out)
		for m := range in {
			select {
			case out <- m:
			case <-d.stopping:
				m.Nack()
			}
		}
	}()
	return out, nil
}

func (d *drainFirst) Close() error {
	d.once.Do(func() {
		close(d.stopping)
		var errs []error
		if err := d.nc.Drain(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			errs = append(errs, err)
		}
		select {
		case <-d.closed:
		case <-time.After(30 * time.Second):
			errs = append(errs, errors.New("the NATS connection did not drain within 30s"))
		}
		// The connection is closed now, so the subscriber's own drain
		// fails; what matters is that it closes its channels.
		_ = d.sub.Close()
		d.forwards.Wait()
		d.err = errors.Join(errs...)
	})
	return d.err
}
