package console

import "net/http"

// OnOverviewRead makes the console h (from New, not yet serving) call f
// before each read of the overview its gauges serve.
func OnOverviewRead(h http.Handler, f func()) { h.(*handler).gauges.onRead = f }
