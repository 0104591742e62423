package console

import (
	"net/http"
	"time"
)

// OnOverviewRead makes the console h (from New, not yet serving) call f
// before each read of the overview its gauges serve.
func OnOverviewRead(h http.Handler, f func()) { h.(*handler).gauges.onRead = f }

// SetClock makes the console h (from New, not yet serving) read the time
// from now for its logins and its login limit.
func SetClock(h http.Handler, now func() time.Time) { h.(*handler).now = now }
