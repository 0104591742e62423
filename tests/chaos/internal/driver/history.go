package driver

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/inboxmill/inboxmill/tests/chaos/internal/wire"
)

// The history check is independent of the counts in check.go: the
// consumers write down what they did (claims, commits, acks, with times)
// and the effects come from the business table or the provider's ledger,
// with the times the database or the provider stamped. Porcupine
// (github.com/anishathalye/porcupine) then decides whether some order of
// the operations, each taking effect at one instant within its interval,
// satisfies the sequential specification of "exactly-once effects": per
// key,
//
//   - effect(key, hash) happens at most once: a second effect is illegal;
//   - commit(key, hash) and ack(key, hash) are legal only once the key's
//     effect has happened, and with the same payload: a delivery that is
//     committed or acked before any effect exists, or whose payload is not
//     the one the effect was made with (a conflicting payload acked as
//     done), is illegal.
//
// Claims are in the history but unconstrained (an event can be claimed
// any number of times). The model is partitioned by key (Model.Partition),
// and keys are checked in batches, so the check stays linear in the
// history's length.

// histInput is the input of one operation of the model.
type histInput struct {
	op, key, hash string
}

// keyState is one key's state: whether its effect happened, and with which
// payload.
type keyState struct {
	effects int
	hash    string
}

// exactlyOnceModel is the sequential specification, per key.
var exactlyOnceModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range history {
			k := op.Input.(histInput).key
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() any { return keyState{} },
	Step: func(state, input, _ any) (bool, any) {
		st, in := state.(keyState), input.(histInput)
		switch in.op {
		case wire.OpEffect:
			if st.effects > 0 {
				return false, st
			}
			return true, keyState{effects: 1, hash: in.hash}
		case wire.OpCommit, wire.OpAck:
			return st.effects == 1 && st.hash == in.hash, st
		default: // claims
			return true, st
		}
	},
	DescribeOperation: func(input, _ any) string {
		in := input.(histInput)
		return fmt.Sprintf("%s(%s, %s)", in.op, in.key, in.hash)
	},
	DescribeState: func(state any) string {
		st := state.(keyState)
		return fmt.Sprintf("effects=%d hash=%s", st.effects, st.hash)
	},
}

// historyVerdict is what the history check found.
type historyVerdict struct {
	ops          map[string]int // by kind
	keys         int
	linearizable bool
	illegal      []string // keys whose operations admit no legal order (the first few)
	took         time.Duration
}

// checkHistory checks ops (without claims, which the model accepts
// anyway). An operation whose Ret is 0 or that is Open is open-ended: it
// returns at end.
func checkHistory(ops []wire.HistoryOp, end int64) historyVerdict {
	start := time.Now()
	v := historyVerdict{ops: map[string]int{}, linearizable: true}
	byKey := map[string][]porcupine.Operation{}
	var keys []string
	for _, o := range ops {
		v.ops[o.Op]++
		if o.Op == wire.OpClaim {
			continue
		}
		ret := o.Ret
		if o.Open || ret == 0 || ret > end {
			ret = end
		}
		if _, ok := byKey[o.Key]; !ok {
			keys = append(keys, o.Key)
		}
		byKey[o.Key] = append(byKey[o.Key], porcupine.Operation{
			Input: histInput{o.Op, o.Key, o.Hash}, Call: min(o.Call, ret), Return: ret})
	}
	v.keys = len(keys)
	slices.Sort(keys)
	// A batch of keys per call: porcupine checks the partitions of one call
	// in parallel, a goroutine each.
	const batch = 2000
	for lo := 0; lo < len(keys); lo += batch {
		var hist []porcupine.Operation
		for _, k := range keys[lo:min(lo+batch, len(keys))] {
			hist = append(hist, byKey[k]...)
		}
		if porcupine.CheckOperations(exactlyOnceModel, hist) {
			continue
		}
		v.linearizable = false
		for _, k := range keys[lo:min(lo+batch, len(keys))] {
			if len(v.illegal) < 10 && !porcupine.CheckOperations(exactlyOnceModel, byKey[k]) {
				v.illegal = append(v.illegal, k)
			}
		}
	}
	v.took = time.Since(start)
	return v
}

// historyDir is where the mode's consumers write their history files.
func (m *modeRun) historyDir() string {
	return filepath.Join(m.r.logDir, "history", m.short)
}

// readHistory reads every consumer's history file of the mode and adds
// the effects, as the business table or the provider's ledger has them.
func (m *modeRun) readHistory(ctx context.Context) ([]wire.HistoryOp, error) {
	var ops []wire.HistoryOp
	files, err := filepath.Glob(filepath.Join(m.historyDir(), "*.jsonl"))
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(fh)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var o wire.HistoryOp
			// A process killed in the middle of a write leaves a partial
			// last line: not an operation it finished.
			if json.Unmarshal(sc.Bytes(), &o) == nil && o.Op != "" {
				ops = append(ops, o)
			}
		}
		err = sc.Err()
		fh.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
	}
	if m.prov != nil {
		charges, _, _ := m.prov.ledger()
		for _, c := range charges {
			ops = append(ops, wire.HistoryOp{Op: wire.OpEffect, Key: c.EventID, Hash: wire.PayloadHash(c.EventID, c.Amount),
				Call: c.CreatedAt, By: "provider"})
		}
		return ops, nil
	}
	q, err := m.db.db.QueryContext(ctx, `SELECT event_id, amount, `+m.db.epochMicros("created_at")+`, consumer FROM `+m.effectsTable)
	if err != nil {
		return nil, err
	}
	defer q.Close()
	for q.Next() {
		var (
			id, by string
			amount int
			at     int64
		)
		if err := q.Scan(&id, &amount, &at, &by); err != nil {
			return nil, err
		}
		ops = append(ops, wire.HistoryOp{Op: wire.OpEffect, Key: id, Hash: wire.PayloadHash(id, amount), Call: at * 1000, By: by})
	}
	return ops, q.Err()
}

// checkLinearizable reads the mode's history and checks it. The merged
// history (history/<mode>.jsonl in the log directory, sorted by call time)
// is written out when the check fails or the logs are kept: a long run's
// is gigabytes.
func (m *modeRun) checkLinearizable(ctx context.Context) {
	ops, err := m.readHistory(ctx)
	if err != nil {
		m.res.history = historyVerdict{}
		m.fail("reading the history: %v", err)
		return
	}
	v := checkHistory(ops, time.Now().Add(time.Hour).UnixNano())
	m.res.history = v
	m.res.historyChecked = true
	merged := filepath.Join(m.r.logDir, "history", m.short+".jsonl")
	if !v.linearizable || m.r.cfg.Keep || m.r.cfg.LogDir != "" {
		slices.SortStableFunc(ops, func(a, b wire.HistoryOp) int { return int(min(max(a.Call-b.Call, -1), 1)) })
		if err := writeHistory(merged, ops); err != nil {
			m.r.printf("chaos: %s: writing the merged history: %v", m.label, err)
		}
	}
	if !v.linearizable {
		m.fail("history not linearizable against one effect per key, no conflicting payload acked: keys %v (history in %s)",
			v.illegal, merged)
	}
}

func writeHistory(path string, ops []wire.HistoryOp) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	enc := json.NewEncoder(w)
	for _, o := range ops {
		if err := enc.Encode(o); err != nil {
			f.Close()
			return err
		}
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
