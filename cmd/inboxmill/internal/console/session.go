package console

import (
	"crypto/rand"
	"sync"
	"time"
)

// maxSessions bounds the logins a console keeps. Only a client with the
// token can add one; when that many are live, the one that would end
// first is dropped.
const maxSessions = 1000

// sessionStore holds the logins this process handed out, by session ID,
// with their expiry. A login cookie is good only while its session is
// here, so that logging out ends it on the server: a copy of the cookie
// taken before the logout does not work after it.
type sessionStore struct {
	mu   sync.Mutex
	byID map[string]time.Time
}

func newSessionStore() *sessionStore { return &sessionStore{byID: map[string]time.Time{}} }

// add starts a session that ends at exp and returns its ID.
func (s *sessionStore) add(now, exp time.Time) string {
	var raw [16]byte
	_, _ = rand.Read(raw[:])
	id := b64.EncodeToString(raw[:])
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.byID) >= maxSessions {
		var first string
		for k, e := range s.byID {
			if !now.Before(e) {
				delete(s.byID, k)
			} else if first == "" || e.Before(s.byID[first]) {
				first = k
			}
		}
		if len(s.byID) >= maxSessions {
			delete(s.byID, first)
		}
	}
	s.byID[id] = exp
	return id
}

// live reports whether session id was started here and has not ended.
func (s *sessionStore) live(id string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	exp, ok := s.byID[id]
	if ok && !now.Before(exp) {
		delete(s.byID, id)
		return false
	}
	return ok
}

// end ends session id.
func (s *sessionStore) end(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.byID, id)
}
