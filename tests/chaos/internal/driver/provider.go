package driver

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/inboxmill/inboxmill/tests/chaos/internal/wire"
)

// provider is a fake payment provider on 127.0.0.1. It records every charge
// per idempotency key and, on purpose, does NOT deduplicate: a second charge
// for one key is a double charge, and the run fails on it. It misbehaves
// the way real ones do, by a seeded die per (key, call):
//
//   - 3% unavailable (503): nothing charged;
//   - 2% slow before charging: the client gives up; the request arrives
//     after its deadline and is refused, so nothing is charged;
//   - 3% slow after charging: charged, but the answer comes after the
//     client gave up (the consumer reports Uncertain; the reconciler asks);
//   - 2% hangs up after charging: the connection closes without an answer
//     (the consumer releases the intent; the next attempt asks first).
//
// Look-ups fail 2% of the time (503).
type provider struct {
	srv  *http.Server
	url  string
	seed uint64
	slow time.Duration

	mu      sync.Mutex
	charges []wire.Charge
	byKey   map[string][]wire.Charge
	calls   map[string]int
	faults  providerFaults
}

type providerFaults struct {
	unavailable, slowBefore, slowAfter, hangups, late, lookupFailures int
}

func startProvider(seed uint64, slow time.Duration) (*provider, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &provider{url: "http://" + ln.Addr().String(), seed: seed, slow: slow,
		byKey: map[string][]wire.Charge{}, calls: map[string]int{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+wire.ChargesPath, p.charge)
	mux.HandleFunc("GET "+wire.ChargesPath, p.lookup)
	p.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = p.srv.Serve(ln) }()
	return p, nil
}

func (p *provider) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if p.srv.Shutdown(ctx) != nil {
		_ = p.srv.Close()
	}
}

// roll is the die of one call: 0 to 999.
func (p *provider) roll(kind, key string, call int) int {
	h := sha256.Sum256(fmt.Appendf(nil, "%d/%s/%s/%d", p.seed, kind, key, call))
	return int(binary.BigEndian.Uint32(h[:4]) % 1000)
}

func (p *provider) charge(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get(wire.HeaderIdempotencyKey)
	deadline, err := strconv.ParseInt(r.Header.Get(wire.HeaderDeadline), 10, 64)
	var req wire.ChargeRequest
	if key == "" || err != nil || json.NewDecoder(r.Body).Decode(&req) != nil || req.EventID == "" {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	p.mu.Lock()
	p.calls[key]++
	dice := p.roll("charge", key, p.calls[key])
	p.mu.Unlock()

	switch {
	case dice < 30:
		p.count(func(f *providerFaults) { f.unavailable++ })
		http.Error(w, "try again later", http.StatusServiceUnavailable)
		return
	case dice < 50:
		p.count(func(f *providerFaults) { f.slowBefore++ })
		time.Sleep(p.slow)
	}
	c, ok := p.record(key, req, deadline)
	if !ok {
		// The client has given up: charging now would be an effect nobody
		// can learn about in time. Real providers that take a deadline
		// (gRPC's, an expiry in the request) behave the same.
		http.Error(w, "deadline passed", http.StatusGatewayTimeout)
		return
	}
	switch {
	case dice >= 50 && dice < 80:
		p.count(func(f *providerFaults) { f.slowAfter++ })
		time.Sleep(p.slow)
	case dice >= 80 && dice < 100:
		p.count(func(f *providerFaults) { f.hangups++ })
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				_ = conn.Close()
				return
			}
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(c)
}

// record charges, unless the request's deadline has passed; the check and
// the charge are one step, so a request charged before its client gave up
// or never.
func (p *provider) record(key string, req wire.ChargeRequest, deadline int64) (wire.Charge, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if time.Now().UnixNano() >= deadline {
		p.faults.late++
		return wire.Charge{}, false
	}
	c := wire.Charge{ID: fmt.Sprintf("ch_%07d", len(p.charges)+1), IdempotencyKey: key, EventID: req.EventID,
		Amount: req.Amount, CreatedAt: time.Now().UnixNano()}
	p.charges = append(p.charges, c)
	p.byKey[key] = append(p.byKey[key], c)
	return c, true
}

func (p *provider) count(f func(*providerFaults)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f(&p.faults)
}

func (p *provider) lookup(w http.ResponseWriter, r *http.Request) {
	key := r.URL.Query().Get("idempotency_key")
	p.mu.Lock()
	p.calls["lookup/"+key]++
	fail := p.roll("lookup", key, p.calls["lookup/"+key]) < 20
	if fail {
		p.faults.lookupFailures++
	}
	found := append([]wire.Charge{}, p.byKey[key]...)
	p.mu.Unlock()
	if fail {
		http.Error(w, "try again later", http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(found)
}

// ledger returns a copy of every charge, and the number of idempotency keys
// charged more than once.
func (p *provider) ledger() (charges []wire.Charge, doubleCharged int, faults providerFaults) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, cs := range p.byKey {
		if len(cs) > 1 {
			doubleCharged++
		}
	}
	return append([]wire.Charge(nil), p.charges...), doubleCharged, p.faults
}

func (p *provider) chargeCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.charges)
}
