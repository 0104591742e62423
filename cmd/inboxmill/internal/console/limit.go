package console

import (
	"net"
	"sync"
	"time"
)

const (
	// DefaultLoginFailures is Config.LoginFailures' default.
	DefaultLoginFailures = 5
	// DefaultLoginLockout is Config.LoginLockout's default.
	DefaultLoginLockout = time.Minute
	// maxLockoutFactor bounds a lockout: at most this many times
	// Config.LoginLockout (16 minutes by default).
	maxLockoutFactor = 16
	// maxLimitedClients bounds the clients the limiter remembers. When
	// that many are failing at once, a new one is refused as if locked
	// out, rather than let an attacker with many addresses grow the table
	// or push a locked-out client out of it.
	maxLimitedClients = 10_000
)

// loginLimiter counts failed token checks (login forms and bearer tokens)
// by client address, and locks a client out once it has failed
// Config.LoginFailures times in a row: for Config.LoginLockout, and after
// that for twice as long as the last lockout at each further failure, up
// to maxLockoutFactor times LoginLockout. A locked-out client's token is
// not checked at all, so that even the right one waits. A success forgets
// the client, and so does a quiet spell as long as the longest lockout.
type loginLimiter struct {
	failures int
	lockout  time.Duration

	mu      sync.Mutex
	clients map[string]*loginClient
}

type loginClient struct {
	failures int       // in a row, since the last success or lockout
	lockouts int       // in a row
	until    time.Time // locked out until
	last     time.Time // the last failure
}

func newLoginLimiter(failures int, lockout time.Duration) *loginLimiter {
	return &loginLimiter{failures: failures, lockout: lockout, clients: map[string]*loginClient{}}
}

// clientOf names the client of a request: its IP address, and for IPv6
// its /64 network, which one host usually holds whole.
func clientOf(remoteAddr string) string {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return host
	}
	if ip.To4() == nil {
		return ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
	}
	return ip.String()
}

// wait returns how long client must wait before a token it sends is
// checked; 0 when it may try now.
func (l *loginLimiter) wait(client string, now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.clients[client]
	if c == nil {
		if len(l.clients) >= maxLimitedClients {
			l.prune(now)
			if len(l.clients) >= maxLimitedClients {
				return l.lockout
			}
		}
		return 0
	}
	if now.Before(c.until) {
		return c.until.Sub(now)
	}
	return 0
}

// failed records a failed token check by client and returns the lockout
// it started, 0 when the client may try again at once.
func (l *loginLimiter) failed(client string, now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.clients[client]
	if c != nil && c.quiet(now) > l.maxLockout() {
		c = nil // a quiet spell: start over
	}
	if c == nil {
		if _, known := l.clients[client]; !known && len(l.clients) >= maxLimitedClients {
			l.prune(now)
			if len(l.clients) >= maxLimitedClients {
				return l.lockout
			}
		}
		c = &loginClient{}
		l.clients[client] = c
	}
	c.last = now
	c.failures++
	if c.failures < l.failures && c.lockouts == 0 {
		return 0
	}
	d := l.lockout
	for i := 0; i < c.lockouts && d < l.maxLockout(); i++ {
		d *= 2
	}
	d = min(d, l.maxLockout())
	c.lockouts++
	c.failures = 0
	c.until = now.Add(d)
	return d
}

func (l *loginLimiter) maxLockout() time.Duration { return l.lockout * maxLockoutFactor }

// quiet is how long c has neither failed nor been locked out.
func (c *loginClient) quiet(now time.Time) time.Duration {
	since := c.last
	if c.until.After(since) {
		since = c.until
	}
	return now.Sub(since)
}

// succeeded forgets client's failures.
func (l *loginLimiter) succeeded(client string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.clients, client)
}

// prune forgets the clients that are not locked out and have been quiet
// for as long as the longest lockout. l.mu is held.
func (l *loginLimiter) prune(now time.Time) {
	for k, c := range l.clients {
		if c.quiet(now) > l.maxLockout() {
			delete(l.clients, k)
		}
	}
}
