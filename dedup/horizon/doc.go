// Package horizon checks that the inbox remembers a message for as long as
// the transport can deliver it again.
//
// # Mental model
//
// The dedup middleware recognises a duplicate by its record. A record is
// kept for dedup.Config.Retention after its outcome and then purged; a
// message delivered after that runs the handler again. How old a message
// can be when it comes again is the transport's business: a Kafka topic
// keeps messages for its retention.ms and a replay (a new consumer group
// from the oldest offset, an offset reset, an expired committed offset)
// reads all of them; watermill-sql keeps every row of its messages table
// unless something deletes them, and a new consumer group reads them all.
// That reach is the replay horizon. A replay is safe while the inbox
// retention is at least the horizon:
//
//	inbox retention >= how old a message can be when it is delivered again
//
// A record is written when its message is first consumed, after the
// message was published, and kept for the retention after its outcome, so
// a record always outlives a message of the same age: the comparison is
// conservative.
//
// # Checking at start-up
//
// [Check] asks a [Source] for its [Horizon] and compares it with an inbox
// retention (the value of dedup.Config.Retention: 0 is
// dedup.DefaultRetention, -1 forever). The [Report] says whether the pair
// is safe, in a sentence fit for a log line. [Require] is the strict
// setting: it returns an error wrapping [ErrHorizonExceeded] (or
// [ErrHorizonUnknown]) when the pair is not shown safe, so that a service
// can refuse to start:
//
//	client, _ := sarama.NewClient(brokers, cfg)
//	rep, err := horizon.Require(ctx, horizon.Kafka(client, "orders"), dedupCfg.Retention)
//	if errors.Is(err, horizon.ErrHorizonExceeded) {
//		log.Fatal(err) // the inbox keeps records for 7d but topic orders keeps messages for 30d: ...
//	}
//
// The sources shipped are [Kafka] (the topic's retention.ms, retention.bytes,
// cleanup.policy and segment.ms, read through the admin API) and
// [SQLQueue] (a watermill-sql messages table on PostgreSQL or MySQL). A
// transport of your own implements [Source], or wraps a known figure in
// [Fixed]. inboxmill replay runs the Kafka check before every dry run.
//
// # What is not checked
//
// The check compares settings with settings, once. It does not see a
// retention changed later, a topic re-created, messages re-published from
// a backup or another topic, nor how long a consumer lags (a record lives
// longer than its message, never shorter). docs/replay-horizon.md says how
// to size the retention.
package horizon
