package webhook_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/inboxmill/inboxmill/handlers/webhook"
)

// A GitHub delivery arrives twice (GitHub redelivers with the same
// X-GitHub-Delivery), then a forgery arrives. Both genuine requests are
// enqueued under one event_id, for the dedup middleware behind the queue;
// the forgery is answered 401 and enqueues nothing.
func ExampleNewReceiver() {
	const secret = "It's a Secret to Everybody"
	queue := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 8}, watermill.NopLogger{})
	defer queue.Close()
	msgs, _ := queue.Subscribe(context.Background(), "github.events")

	receiver, err := webhook.NewReceiver(queue, webhook.ReceiverConfig{
		Topic:    "github.events",
		Verifier: webhook.GitHubVerifier(secret),
		Tenant:   "acme",
	})
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(receiver)
	defer srv.Close()

	// deliver sends body as GitHub does, signed with key.
	deliver := func(body, key string) {
		m := hmac.New(sha256.New, []byte(key))
		m.Write([]byte(body))
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(body))
		req.Header.Set("X-Hub-Signature-256", "sha256="+hex.EncodeToString(m.Sum(nil)))
		req.Header.Set("X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958")
		req.Header.Set("X-GitHub-Event", "push")
		resp, err := srv.Client().Do(req)
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		fmt.Println(resp.Status)
	}
	body := `{"ref":"refs/heads/main","after":"9049f1265b7d61be4a8904a9a27120d2064dab3b"}`
	deliver(body, secret)
	deliver(body, secret) // a redelivery
	deliver(body, "guessed secret")

	for range 2 {
		msg := <-msgs
		fmt.Println(msg.Metadata.Get(webhook.MetadataEventID), msg.Metadata.Get(webhook.MetadataTenantID),
			msg.Metadata.Get(webhook.MetadataProvider), msg.Metadata.Get(webhook.MetadataEventType))
		msg.Ack()
	}
	// Output:
	// 200 OK
	// 200 OK
	// 401 Unauthorized
	// 72d3162e-cc78-11e3-81ab-4c9367dc0958 acme github push
	// 72d3162e-cc78-11e3-81ab-4c9367dc0958 acme github push
}
