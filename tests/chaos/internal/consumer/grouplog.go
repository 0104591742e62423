package consumer

import (
	"context"
	"log"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
)

// groupLog is a watermill-kafka tracer that only logs what the group gives
// this consumer: each session's member ID, generation and partitions, and
// when each partition's claim starts and ends (and at which offset). With
// -v it tells which partitions a consumer held when a group stops making
// progress.
type groupLog struct{ l *log.Logger }

func (t groupLog) WrapConsumer(c sarama.Consumer) sarama.Consumer { return c }

func (t groupLog) WrapPartitionConsumer(pc sarama.PartitionConsumer) sarama.PartitionConsumer {
	return pc
}

func (t groupLog) WrapSyncProducer(_ *sarama.Config, p sarama.SyncProducer) sarama.SyncProducer {
	return p
}

func (t groupLog) WrapConsumerGroupHandler(h sarama.ConsumerGroupHandler) sarama.ConsumerGroupHandler {
	return loggedHandler{ConsumerGroupHandler: h, l: t.l}
}

type loggedHandler struct {
	sarama.ConsumerGroupHandler
	l *log.Logger
}

func (h loggedHandler) Setup(s sarama.ConsumerGroupSession) error {
	h.l.Printf("session setup member=%s generation=%d claims=%v", s.MemberID(), s.GenerationID(), s.Claims())
	return h.ConsumerGroupHandler.Setup(s)
}

func (h loggedHandler) Cleanup(s sarama.ConsumerGroupSession) error {
	h.l.Printf("session cleanup member=%s generation=%d", s.MemberID(), s.GenerationID())
	return h.ConsumerGroupHandler.Cleanup(s)
}

func (h loggedHandler) ConsumeClaim(s sarama.ConsumerGroupSession, c sarama.ConsumerGroupClaim) error {
	start := time.Now()
	h.l.Printf("claim start generation=%d partition=%d initial_offset=%d high_water=%d",
		s.GenerationID(), c.Partition(), c.InitialOffset(), c.HighWaterMarkOffset())
	ls := &markedSession{ConsumerGroupSession: s}
	ls.marked.Store(-1)
	err := h.ConsumerGroupHandler.ConsumeClaim(ls, c)
	h.l.Printf("claim end generation=%d partition=%d marked=%d high_water=%d session_err=%v err=%v after=%v",
		s.GenerationID(), c.Partition(), ls.marked.Load(), c.HighWaterMarkOffset(), context.Cause(s.Context()), err,
		time.Since(start).Round(time.Millisecond))
	return err
}

// markedSession remembers the last offset marked through it (one claim's).
type markedSession struct {
	sarama.ConsumerGroupSession
	marked atomic.Int64
}

func (s *markedSession) MarkMessage(msg *sarama.ConsumerMessage, metadata string) {
	s.marked.Store(msg.Offset + 1)
	s.ConsumerGroupSession.MarkMessage(msg, metadata)
}
