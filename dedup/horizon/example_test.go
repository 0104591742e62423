package horizon_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/IBM/sarama"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/dedup/horizon"
)

// At start-up, compare the inbox retention of every operation with the
// horizon of the topic it consumes: warn, or refuse to start (Require).
// Here the horizon is a fixed figure; with Kafka it is
// horizon.Kafka(client, "orders").
func ExampleRequire() {
	cfg := dedup.Config{Operation: "ship_order", Retention: 7 * 24 * time.Hour}
	orders := horizon.Fixed(horizon.Horizon{Name: "topic orders", Age: 30 * 24 * time.Hour})

	_, err := horizon.Require(context.Background(), orders, cfg.Retention)
	if errors.Is(err, horizon.ErrHorizonExceeded) {
		fmt.Println("refusing to start:", err)
	}
	// Output:
	// refusing to start: the inbox keeps records for 7d but topic orders keeps messages for 30d: messages older than 7d would run again
}

// A warning rather than a refusal: Check reports, the caller decides.
func ExampleCheck() {
	orders := horizon.Fixed(horizon.Horizon{Name: "topic orders", Age: 3 * 24 * time.Hour})
	rep, err := horizon.Check(context.Background(), orders, 0) // 0: dedup.DefaultRetention
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(rep.Safe, rep)
	// Output:
	// true the inbox keeps records for 7d and topic orders keeps messages for 3d: every message that can come again is recognised
}

// The Kafka source reads the topic's configs through the client's admin
// API; run it before the router starts.
func ExampleKafka() {
	ctx := context.Background()
	client, err := sarama.NewClient([]string{"localhost:9092"}, sarama.NewConfig())
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	cfg := dedup.Config{Operation: "ship_order"}
	rep, err := horizon.Check(ctx, horizon.Kafka(client, "orders"), cfg.Retention)
	if err != nil {
		log.Fatal(err)
	}
	if !rep.Safe {
		log.Print("warning: ", rep)
	}
}
