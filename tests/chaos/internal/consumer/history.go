package consumer

import (
	"encoding/json"
	"os"
	"sync"
	"time"

	"github.com/inboxmill/inboxmill/tests/chaos/internal/wire"
)

// history appends the consumer's operations to its history file, one
// write(2) per line and unbuffered, so that a line written before a SIGKILL
// is in the file: a killed process loses only operations it had not
// finished. A nil history records nothing.
type history struct {
	mu   sync.Mutex
	f    *os.File
	by   string
	open bool // every commit and ack is open-ended (sql-queue)
}

func openHistory(path, by string, open bool) (*history, error) {
	if path == "" {
		return nil, nil
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &history{f: f, by: by, open: open}, nil
}

func (h *history) record(op, key, hash string, call time.Time) {
	if h == nil || key == "" {
		return
	}
	rec := wire.HistoryOp{Op: op, Key: key, Hash: hash, Call: call.UnixNano(), Ret: time.Now().UnixNano(), By: h.by,
		Open: h.open && op != wire.OpClaim}
	b, err := json.Marshal(rec)
	if err != nil {
		return
	}
	b = append(b, '\n')
	h.mu.Lock()
	defer h.mu.Unlock()
	_, _ = h.f.Write(b)
}

func (h *history) close() {
	if h != nil {
		_ = h.f.Close()
	}
}
