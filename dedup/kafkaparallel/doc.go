// Package kafkaparallel is a Watermill subscriber for Kafka that runs many
// messages of one partition at the same time while keeping the messages of
// each key in offset order, and commits per partition the low watermark of
// what is done. Behind the dedup middleware that is exactly-once effects
// at the speed of the database rather than of one round trip per
// partition.
//
// # Why a subscriber of its own
//
// watermill-kafka's subscriber hands the router one message per partition
// and waits for its ack before it reads the next, so a consumer runs at
// most as many messages at once as it has partitions, and group commit
// forms groups no larger than that. This subscriber keeps up to
// Config.MaxInFlightPerPartition messages of a partition in flight: each
// message goes to the lane of its ordering key (the Kafka record key by
// default, or Config.OrderingKey: an aggregate's ID, an account); a lane
// runs its messages one after the other, in offset order, and different
// lanes run at the same time. A nacked message is sent again in its place,
// so the messages behind it in its lane wait; other lanes go on.
//
// It takes watermill-kafka's own kafka.SubscriberConfig (brokers, consumer
// group, Sarama settings, unmarshaler, nack pause, tracer) beside its
// Config, so switching is a change of constructor: the consumer group's
// committed offsets mean the same to both, and either can take over a
// group the other consumed. What differs: the message context carries the
// record through this package's MessagePartitionFromCtx and its siblings
// (watermill-kafka's context keys are its own), offsets are committed
// every Config.CommitInterval rather than as Sarama's AutoCommit settings
// say, and a ConsumerGroup is required.
//
// # The low watermark, and why the inbox makes it enough
//
// Messages of different keys complete out of offset order, and Kafka
// stores one committed offset per partition. The subscriber commits the
// partition's low watermark: the first offset it read and has not seen
// acked. After a crash the partition's next owner receives everything at
// and above it again, including messages that were done: each of those is
// a duplicate the inbox acknowledges without running the handler
// (inbox records outlive any redelivery window), so no offset list needs
// encoding into the commit metadata, as Confluent's Parallel Consumer
// must do without an inbox. Without the dedup middleware (or another
// idempotent handler) the subscriber is at least once, as any Kafka
// consumer, with up to Config.MaxWindow messages a partition received
// again after a crash.
//
// Per key the order of effects survives redelivery: a lane starts a
// message only after the one before it was acked, so of a key's messages
// at most one is unfinished at a time, and everything before it is done.
//
// # Rebalances, Close and stragglers
//
// A revoked partition (an eager rebalance ends the session; a cooperative
// one closes the claim) stops taking messages, waits up to
// Config.DrainTimeout for its running ones, commits its watermark and
// hands over. A message still running then has its context cancelled and
// is left to the next owner, which receives it again; if both complete,
// the inbox's unique constraint (transactional mode) or lease and fencing
// (reserve mode) let one effect through. Close drains every partition the
// same way.
//
// # Poison and bad records
//
// A message the handler refuses for good goes to the poison queue as with
// any subscriber (middleware.PoisonQueue with dedup.IsPoison) and is then
// acked, so the watermark moves past it. A record the Unmarshaler refuses
// is never delivered: Config.Undecodable decides (PublishUndecodable sends
// it to a dead-letter topic); without it the record stays and holds its
// partition's watermark, with an error in the log.
//
// # Memory
//
// Bounded by the settings, never by the backlog: MaxInFlightPerPartition
// and MaxInFlight messages decoded, MaxWindow offsets of bookkeeping a
// partition, and Sarama's read-ahead (Consumer.ChannelBufferSize records
// a partition and its fetch sizes).
//
// # Usage
//
//	sub, err := kafkaparallel.NewSubscriber(kafka.SubscriberConfig{
//		Brokers:               brokers,
//		ConsumerGroup:         "shipping",
//		OverwriteSaramaConfig: saramaConfig,
//	}, kafkaparallel.Config{
//		MaxInFlightPerPartition: 32,
//		Ordering:                kafkaparallel.OrderByKey, // the record key
//	}, logger)
//	router.AddMiddleware(poison, d.Middleware) // the dedup middleware
//	router.AddConsumerHandler("ship_order", "orders", sub, handle)
//
// With group commit (dedup.Transactional{Group: &dedup.Group{}}) the
// groups fill from the many messages in flight, even with few partitions.
package kafkaparallel
