package main

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"
)

// provider is a fake payment service provider on 127.0.0.1. Like many real
// ones it is slow at times, fails at times, and — on purpose, to make the
// point — does NOT deduplicate: every POST is a new charge, even with an
// Idempotency-Key it has seen. A second charge for one intent is a double
// charge, and this program counts them.
type provider struct {
	srv  *http.Server
	addr string
	seed int64
	// slow is how long a "slow" charge takes: longer than the client waits.
	slow time.Duration

	mu      sync.Mutex
	charges []charge
	byKey   map[string][]charge
	calls   map[string]int
}

type charge struct {
	ID     string `json:"id"`
	Key    string `json:"idempotency_key"`
	Intent string `json:"intent"`
	Amount int    `json:"amount"`
	// Status is "succeeded", or "review": the provider holds the charge
	// for a manual review and has not decided yet.
	Status string `json:"status"`
}

// reviewAbove: the provider holds charges above this amount (and within
// the card's limit) for a manual review that outlasts the run.
const reviewAbove = 4000

func startProvider(seed int64, slow time.Duration) (*provider, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &provider{addr: "http://" + ln.Addr().String(), seed: seed, slow: slow,
		byKey: map[string][]charge{}, calls: map[string]int{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /charges", p.create)
	mux.HandleFunc("GET /charges", p.lookup)
	p.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = p.srv.Serve(ln) }()
	return p, nil
}

func (p *provider) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = p.srv.Shutdown(ctx)
}

// roll is a deterministic die per (key, call number), so a seed replays a run.
func (p *provider) roll(key string, call int) int {
	h := sha256.Sum256(fmt.Appendf(nil, "%d/%s/%d", p.seed, key, call))
	return int(binary.BigEndian.Uint32(h[:4]) % 100)
}

func (p *provider) create(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	var req struct {
		Intent string `json:"intent"`
		Amount int    `json:"amount"`
	}
	if key == "" || json.NewDecoder(r.Body).Decode(&req) != nil {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	p.mu.Lock()
	p.calls[key]++
	dice := p.roll(key, p.calls[key])
	p.mu.Unlock()

	switch {
	case req.Amount > 5000:
		http.Error(w, `{"error":"card_declined"}`, http.StatusPaymentRequired)
		return
	case dice < 10: // unavailable: nothing charged
		http.Error(w, "try again", http.StatusServiceUnavailable)
		return
	}
	if req.Amount > reviewAbove {
		// Taken, but not decided: the answer says so at once.
		c := p.record(key, req.Intent, req.Amount, "review")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		_ = json.NewEncoder(w).Encode(c)
		return
	}
	c := p.record(key, req.Intent, req.Amount, "succeeded")
	if dice < 30 {
		// Charged, but the answer comes after the client gave up: from the
		// client's side the outcome is unknown.
		time.Sleep(p.slow)
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(c)
}

func (p *provider) record(key, intent string, amount int, status string) charge {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := charge{ID: fmt.Sprintf("ch_%05d", len(p.charges)+1), Key: key, Intent: intent, Amount: amount, Status: status}
	p.charges = append(p.charges, c)
	p.byKey[key] = append(p.byKey[key], c)
	return c
}

// lookup answers "which charges carry this idempotency key?", what a
// reconciler asks.
func (p *provider) lookup(w http.ResponseWriter, r *http.Request) {
	key := r.URL.Query().Get("idempotency_key")
	p.mu.Lock()
	found := append([]charge{}, p.byKey[key]...)
	p.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(found)
}

// totals reports every charge, and how many intents were charged twice.
func (p *provider) totals() (charges, doubleCharges int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, cs := range p.byKey {
		if len(cs) > 1 {
			doubleCharges++
		}
	}
	return len(p.charges), doubleCharges
}

// client is the consumer's side of the provider API.
type client struct {
	base string
	http *http.Client
}

var (
	errDeclined    = errors.New("card declined")
	errUnavailable = errors.New("provider unavailable")
	// errInReview: the provider took the charge but holds it for a
	// manual review; whether it goes through is not known yet.
	errInReview = errors.New("charge held for review")
)

// charge sends one charge. A timeout is returned as is: the caller decides
// that it means "uncertain".
func (c *client) charge(ctx context.Context, key, intent string, amount int) (charge, error) {
	body, _ := json.Marshal(map[string]any{"intent": intent, "amount": amount})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/charges", bytesReader(body))
	if err != nil {
		return charge{}, err
	}
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	// net/http resends a request carrying an Idempotency-Key by itself when
	// a reused connection closes before the answer. Against a provider that
	// does not deduplicate that is a second charge; retries are ours to make.
	req.GetBody = nil
	resp, err := c.http.Do(req)
	if err != nil {
		return charge{}, err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		var ch charge
		return ch, json.NewDecoder(resp.Body).Decode(&ch)
	case http.StatusAccepted:
		var ch charge
		if err := json.NewDecoder(resp.Body).Decode(&ch); err != nil {
			return charge{}, err
		}
		return ch, errInReview
	case http.StatusPaymentRequired:
		return charge{}, errDeclined
	default:
		return charge{}, fmt.Errorf("%w: HTTP %d", errUnavailable, resp.StatusCode)
	}
}

// find looks charges up by idempotency key.
func (c *client) find(ctx context.Context, key string) ([]charge, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/charges?idempotency_key="+key, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("lookup: HTTP %d", resp.StatusCode)
	}
	var found []charge
	return found, json.NewDecoder(resp.Body).Decode(&found)
}
