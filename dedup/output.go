package dedup

import (
	"errors"
	"log/slog"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/inboxmill/inboxmill/inbox"
)

// outputDropped logs and counts a handler's output that the store refused
// as too large (err satisfies errors.Is inbox.ErrResultTooLarge): the
// intent completes without it, and its duplicates are acked without
// replaying it. The line names the key's digest, the output's size and the
// store's limit, never the output.
func (d *Deduplicator) outputDropped(msg *message.Message, id identity, err error) {
	d.stats.outputDropped.Add(1)
	d.metrics.observeOutputDropped(id.Operation)
	if !d.log.enabled(slog.LevelInfo) {
		return
	}
	fields := d.logFields(msg, id, OutcomeExecuted, err)
	var tl *inbox.ResultTooLargeError
	if errors.As(err, &tl) {
		fields["output_bytes"], fields["limit_bytes"] = tl.Size, tl.Limit
	}
	d.log.Info("inboxmill: handler output too large to store; completed without it, duplicates will not replay it", fields)
}
