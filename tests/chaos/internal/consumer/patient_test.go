package consumer

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
)

// flakySubscriber fails its first subscriptions as watermill-kafka's does
// while no broker answers.
type flakySubscriber struct {
	failures, calls int
}

func (f *flakySubscriber) Subscribe(context.Context, string) (<-chan *message.Message, error) {
	f.calls++
	if f.calls <= f.failures {
		return nil, fmt.Errorf("cannot create new Sarama client: %w", sarama.ErrOutOfBrokers)
	}
	return make(chan *message.Message), nil
}

func (f *flakySubscriber) Close() error { return nil }

// TestBrokerPatientSubscribe: a consumer started while the broker
// restarts subscribes once it is back, instead of exiting; other errors,
// and a broker that stays away past the patience, still fail.
func TestBrokerPatientSubscribe(t *testing.T) {
	f := &flakySubscriber{failures: 3}
	if _, err := (brokerPatient{Subscriber: f, patience: 10 * time.Second}).Subscribe(context.Background(), "t"); err != nil {
		t.Fatalf("subscribe after the broker came back: %v", err)
	}
	if f.calls != 4 {
		t.Fatalf("%d subscriptions, want 4", f.calls)
	}
	gone := &flakySubscriber{failures: 1 << 30}
	if _, err := (brokerPatient{Subscriber: gone, patience: 600 * time.Millisecond}).Subscribe(context.Background(), "t"); !errors.Is(err, sarama.ErrOutOfBrokers) {
		t.Fatalf("a broker that stays away: %v, want ErrOutOfBrokers", err)
	}
}
