package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/dedup/horizon"
	"github.com/inboxmill/inboxmill/inbox"
)

// partitionRange is the offsets [start, end) of one partition to read.
type partitionRange struct {
	partition  int32
	start, end int64
}

// item is what a partition reader hands the aggregator: a prediction, the
// end of a partition cut short, or an error.
type item struct {
	partition int32
	offset    int64
	published time.Time
	res       dedup.DryRunResult
	// warning is set when the partition went idle before its end.
	warning string
	err     error
}

// dryRun reads the range and reports what a replay would do.
func (a *app) dryRun(ctx context.Context, o options) error {
	stdout, stderr := a.stdout, a.stderr
	i, err := openInbox(ctx, a.db, readOnly, true)
	if err != nil {
		return err
	}
	defer i.Close()
	store := i.store
	d, err := dedup.New(store, o.dedupConfig())
	if err != nil {
		return err
	}

	cfg := sarama.NewConfig()
	cfg.Version = o.kafkaVersion
	cfg.ClientID = "inboxmill-replay"
	cfg.Consumer.Return.Errors = true
	cfg.Metadata.Full = false
	client, err := sarama.NewClient(o.brokers, cfg)
	if err != nil {
		return fmt.Errorf("connect to Kafka at %s: %w", strings.Join(o.brokers, ","), err)
	}
	defer client.Close()
	if err := checkHorizon(ctx, horizon.Kafka(client, o.topic), o, stderr); err != nil {
		return err
	}
	ranges, err := plan(client, o)
	if err != nil {
		return err
	}
	// Messages published before the operation's oldest record have no
	// record older than them: read once, before the range.
	oldest, err := store.OldestCreated(ctx, o.operation)
	if err != nil {
		return err
	}
	var total int64
	fmt.Fprintf(stdout, "topic %s, inbox table %s, operation %q:\n", o.topic, store.Table(), o.operation)
	for _, r := range ranges {
		fmt.Fprintf(stdout, "  partition %d: offsets %d to %d (%d messages)\n", r.partition, r.start, r.end, r.end-r.start)
		total += r.end - r.start
	}
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		return err
	}
	defer consumer.Close()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	results := make(chan item, 256)
	go func() {
		var wg sync.WaitGroup
		sem := make(chan struct{}, o.concurrency)
		for _, r := range ranges {
			if r.start >= r.end {
				continue
			}
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
			}
			if ctx.Err() != nil {
				break
			}
			wg.Go(func() {
				defer func() { <-sem }()
				readPartition(ctx, consumer, d, o, r, results)
			})
		}
		wg.Wait()
		close(results)
	}()

	var (
		report   dedup.DryRunReport
		older    int64 // published before the oldest record
		shown    int
		warnings []string
		start    = time.Now()
		tick     <-chan time.Time
	)
	if o.progressInterval > 0 {
		t := time.NewTicker(o.progressInterval)
		defer t.Stop()
		tick = t.C
	}
	progress := func() {
		pct := 100.0
		if total > 0 {
			pct = 100 * float64(report.Messages) / float64(total)
		}
		rate := float64(report.Messages) / max(time.Since(start).Seconds(), 1e-3)
		fmt.Fprintf(stderr, "progress: %d/%d messages (%.0f%%), %.0f msg/s, %s\n", report.Messages, total, pct, rate, report.String())
	}
	for done := false; !done; {
		select {
		case it, ok := <-results:
			switch {
			case !ok:
				done = true
			case it.err != nil:
				cancel()
				for range results {
				}
				return it.err
			case it.warning != "":
				warnings = append(warnings, it.warning)
			default:
				if oldest.IsZero() || (!it.published.IsZero() && it.published.Before(oldest)) {
					older++
				}
				class := report.Add(it.res)
				if class != dedup.DryRunDuplicate && shown < o.show {
					shown++
					fmt.Fprintln(stdout, describe(it, class))
				}
				if o.progressEvery > 0 && report.Messages%int64(o.progressEvery) == 0 {
					progress()
				}
			}
		case <-tick:
			progress()
		case <-ctx.Done():
			for range results {
			}
			return ctx.Err()
		}
	}
	for _, w := range warnings {
		fmt.Fprintln(stderr, "warning:", w)
	}
	if rest := report.Messages - report.Duplicate; rest > int64(shown) {
		fmt.Fprintf(stdout, "  ... and %d more that are not duplicates (-show lists more)\n", rest-int64(shown))
	}
	hints, err := replayHints(ctx, store, o, report)
	if err != nil {
		return err
	}
	for _, h := range hints {
		fmt.Fprintln(stderr, "hint:", h)
	}
	if oldest.IsZero() {
		fmt.Fprintf(stdout, "  older than every record: %d messages (operation %q has no records)\n", older, o.operation)
	} else {
		fmt.Fprintf(stdout, "  older than every record: %d messages, published before the oldest record of operation %q "+
			"was created (%s)\n", older, o.operation, oldest.UTC().Format(time.RFC3339))
	}
	fmt.Fprintf(stdout, "a replay would run the handler for %d messages (%d new, %d older than the retention window), "+
		"ack %d duplicates without running it, and refuse %d (%d conflicting, %d invalid)\n",
		report.WouldExecute(), report.New, report.Expired, report.Duplicate, report.Conflict+report.Invalid,
		report.Conflict, report.Invalid)
	fmt.Fprintln(stdout, report.String())
	return nil
}

// checkHorizon compares the topic's retention with --retention before
// anything is read: a warning on stderr when the inbox forgets sooner
// than the topic (or the retention cannot be read), an error with
// --strict-horizon.
func checkHorizon(ctx context.Context, src horizon.Source, o options, stderr io.Writer) error {
	rep, err := horizon.Check(ctx, src, o.retention)
	switch {
	case err != nil && o.strictHorizon:
		return fmt.Errorf("--strict-horizon: cannot compare --retention with the retention of topic %s: %w", o.topic, err)
	case err != nil:
		fmt.Fprintf(stderr, "warning: cannot compare --retention with the retention of topic %s, so a replay may run "+
			"messages whose records were purged: %v\n", o.topic, err)
	case !rep.Safe && o.strictHorizon:
		return rep.Err()
	case !rep.Safe:
		fmt.Fprintln(stderr, "warning:", rep.Message)
	}
	return nil
}

// replayHints points at the setting a report suggests is wrong: messages
// that would run although the inbox has no record of the operation at all
// (a wrong --operation or --table), most keyed messages conflicting (the
// fingerprint settings differ from the middleware's), or no message with a
// usable key.
func replayHints(ctx context.Context, store *inbox.Store, o options, r dedup.DryRunReport) ([]string, error) {
	var hints []string
	keyed := r.Messages - r.Invalid
	if r.Messages > 0 && keyed == 0 {
		hints = append(hints, "no message has a usable key: check --key-metadata or --key-json (and --scope-metadata), "+
			"which must match the middleware's Key and Scope")
	}
	if r.WouldExecute() > 0 {
		page, err := store.List(ctx, inbox.Filter{Operation: o.operation, Limit: 1})
		if err != nil {
			return nil, err
		}
		if len(page.Records) == 0 {
			hints = append(hints, fmt.Sprintf("no records exist for operation %q in table %s: check --operation "+
				"(the handler's name, or dedup.Config.Operation) and --table", o.operation, store.Table()))
		}
	}
	if r.Conflict > 1 && 2*r.Conflict >= keyed {
		hints = append(hints, fmt.Sprintf("%d of %d keyed messages conflict with their records: the fingerprint differs "+
			"from the one the middleware stored; check --ignore-fields (fields a producer re-stamps, such as sent_at) "+
			"and --raw-fingerprint, which must match the middleware's settings", r.Conflict, keyed))
	}
	return hints, nil
}

// describe renders one message that is not a plain duplicate. Keys are shown
// as digests: they may carry customer data.
func describe(it item, class dedup.DryRunClass) string {
	s := fmt.Sprintf("  partition=%d offset=%d class=%s", it.partition, it.offset, class)
	if it.res.KeyDigest != "" {
		s += " key_digest=" + it.res.KeyDigest
	}
	if !it.published.IsZero() {
		s += " published=" + it.published.UTC().Format(time.RFC3339)
	}
	if it.res.Err != nil && class == it.res.Class {
		s += fmt.Sprintf(" reason=%q", it.res.Err.Error())
	}
	return s
}

// plan turns the flags into an offset range per partition, within what the
// partitions hold now.
func plan(client sarama.Client, o options) ([]partitionRange, error) {
	all, err := client.Partitions(o.topic)
	if err != nil {
		return nil, fmt.Errorf("topic %s: %w", o.topic, err)
	}
	exists := map[int32]bool{}
	for _, p := range all {
		exists[p] = true
	}
	parts := all
	if o.partitions != nil {
		parts = o.partitions
	}
	for _, p := range parts {
		if !exists[p] {
			return nil, fmt.Errorf("topic %s has no partition %d (it has %d)", o.topic, p, len(all))
		}
	}
	for _, m := range []map[int32]int64{o.from.perPartition, o.to.perPartition} {
		for p := range m {
			if !exists[p] {
				return nil, fmt.Errorf("topic %s has no partition %d (it has %d)", o.topic, p, len(all))
			}
		}
	}
	ranges := make([]partitionRange, 0, len(parts))
	for _, p := range parts {
		oldest, err1 := client.GetOffset(o.topic, p, sarama.OffsetOldest)
		end, err2 := client.GetOffset(o.topic, p, sarama.OffsetNewest)
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("offsets of %s/%d: %w", o.topic, p, err)
		}
		r := partitionRange{partition: p, start: oldest, end: end}
		if v, ok := o.from.get(p); ok {
			r.start = max(v, oldest)
		}
		if !o.since.IsZero() {
			v, err := client.GetOffset(o.topic, p, o.since.UnixMilli())
			if err != nil {
				return nil, fmt.Errorf("offset of %s/%d at %s: %w", o.topic, p, o.since.Format(time.RFC3339), err)
			}
			if v < 0 { // nothing that recent
				v = end
			}
			r.start = max(v, oldest)
		}
		if v, ok := o.to.get(p); ok {
			r.end = min(v, end)
		}
		r.start = min(r.start, r.end)
		ranges = append(ranges, r)
	}
	return ranges, nil
}

// readPartition reads one partition's range, predicts each message and
// hands the predictions on in offset order.
func readPartition(ctx context.Context, consumer sarama.Consumer, d *dedup.Deduplicator, o options, r partitionRange,
	results chan<- item,
) {
	send := func(it item) bool {
		select {
		case results <- it:
			return true
		case <-ctx.Done():
			return false
		}
	}
	pc, err := consumer.ConsumePartition(o.topic, r.partition, r.start)
	if err != nil {
		send(item{err: fmt.Errorf("read %s/%d from offset %d: %w", o.topic, r.partition, r.start, err)})
		return
	}
	defer pc.AsyncClose()
	idle := time.NewTimer(o.idle)
	defer idle.Stop()
	for next := r.start; next < r.end; {
		select {
		case km, ok := <-pc.Messages():
			if !ok || km.Offset >= r.end {
				return
			}
			// The same conversion as watermill-kafka's subscriber: headers
			// become metadata, the value the payload.
			msg, err := kafka.DefaultMarshaler{}.Unmarshal(km)
			if err != nil {
				send(item{err: fmt.Errorf("%s/%d offset %d: %w", o.topic, r.partition, km.Offset, err)})
				return
			}
			var published time.Time
			if km.Timestamp.UnixMilli() > 0 {
				published = km.Timestamp
			}
			res, err := d.DryRun(ctx, msg, published)
			if err != nil {
				send(item{err: fmt.Errorf("%s/%d offset %d: %w", o.topic, r.partition, km.Offset, err)})
				return
			}
			if !send(item{partition: r.partition, offset: km.Offset, published: published, res: res}) {
				return
			}
			next = km.Offset + 1
			idle.Reset(o.idle)
		case err := <-pc.Errors():
			send(item{err: fmt.Errorf("read %s/%d: %w", o.topic, r.partition, err)})
			return
		case <-idle.C:
			send(item{warning: fmt.Sprintf("partition %d: nothing at offsets %d to %d for %v; stopped there "+
				"(transaction markers and compaction leave gaps in offsets; a slow broker also explains it)",
				r.partition, next, r.end, o.idle)})
			return
		case <-ctx.Done():
			return
		}
	}
}
