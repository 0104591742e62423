// Package service is the one life-cycle of inboxmill's background
// workers (the purger, the reconciler): a pass run now and then on an
// interval, between Run(ctx) — which blocks, as Watermill's Router.Run
// does — or Start, and Close. A worker can be started again after Close.
package service

import (
	"context"
	"errors"
	"sync"
	"time"
)

// ErrRunning: Run or Start was called while the worker runs.
var ErrRunning = errors.New("already running")

// Loop runs a pass on an interval. The zero value is ready; it must not be
// copied after first use.
type Loop struct {
	mu      sync.Mutex
	cancel  context.CancelFunc
	done    chan struct{}
	running chan struct{} // closed while a run is under way
}

// Run runs pass now and then every interval until ctx ends or Close is
// called, and returns nil then; pass gets a context that ends at the same
// moment. It returns ErrRunning when the loop already runs.
func (l *Loop) Run(ctx context.Context, interval time.Duration, pass func(context.Context)) error {
	ctx, done, err := l.begin(ctx)
	if err != nil {
		return err
	}
	defer l.end(done)
	loop(ctx, interval, pass)
	return nil
}

// Start is Run in a goroutine of its own, detached from any caller's
// context: it runs until Close.
func (l *Loop) Start(interval time.Duration, pass func(context.Context)) error {
	ctx, done, err := l.begin(context.Background())
	if err != nil {
		return err
	}
	go func() {
		defer l.end(done)
		loop(ctx, interval, pass)
	}()
	return nil
}

func (l *Loop) begin(parent context.Context) (context.Context, chan struct{}, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done != nil {
		return nil, nil, ErrRunning
	}
	ctx, cancel := context.WithCancel(parent)
	l.cancel, l.done = cancel, make(chan struct{})
	if l.running == nil {
		l.running = make(chan struct{})
	}
	close(l.running)
	return ctx, l.done, nil
}

func (l *Loop) end(done chan struct{}) {
	l.mu.Lock()
	l.cancel()
	l.cancel, l.done = nil, nil
	l.running = make(chan struct{})
	l.mu.Unlock()
	close(done)
}

func loop(ctx context.Context, interval time.Duration, pass func(context.Context)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		pass(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Running returns a channel that is closed while the loop runs (as
// Watermill's Router.Running): wait on it to know a Start has begun.
func (l *Loop) Running() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.running == nil {
		l.running = make(chan struct{})
	}
	return l.running
}

// Close stops a running loop and waits for the pass under way to end. It
// is safe to call more than once, and on a loop that never ran.
func (l *Loop) Close() error {
	l.mu.Lock()
	cancel, done := l.cancel, l.done
	l.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	<-done
	return nil
}
