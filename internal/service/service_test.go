package service

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStartCloseRestart(t *testing.T) {
	var l Loop
	var passes atomic.Int64
	pass := func(context.Context) { passes.Add(1) }
	for round := range 3 {
		if err := l.Start(time.Millisecond, pass); err != nil {
			t.Fatalf("round %d: start: %v", round, err)
		}
		<-l.Running()
		if err := l.Start(time.Millisecond, pass); !errors.Is(err, ErrRunning) {
			t.Fatalf("round %d: second start: %v, want ErrRunning", round, err)
		}
		before := passes.Load()
		for passes.Load() < before+3 {
			time.Sleep(time.Millisecond)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRunEndsWithContextAndPassSeesIt(t *testing.T) {
	var l Loop
	ctx, cancel := context.WithCancel(context.Background())
	ended := make(chan error)
	var sawDone atomic.Bool
	go func() {
		ended <- l.Run(ctx, time.Hour, func(pctx context.Context) {
			cancel()
			<-pctx.Done()
			sawDone.Store(true)
		})
	}()
	select {
	case err := <-ended:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	if !sawDone.Load() {
		t.Fatal("the pass's context did not end with Run's")
	}
	// A finished Run leaves the loop ready to run again.
	ctx2, cancel2 := context.WithCancel(context.Background())
	cancel2()
	if err := l.Run(ctx2, time.Hour, func(context.Context) {}); err != nil {
		t.Fatal(err)
	}
}

func TestCloseStopsRun(t *testing.T) {
	var l Loop
	ended := make(chan error)
	go func() { ended <- l.Run(context.Background(), time.Millisecond, func(context.Context) {}) }()
	<-l.Running()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-ended; err != nil {
		t.Fatal(err)
	}
}
