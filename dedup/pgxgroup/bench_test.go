package pgxgroup_test

import (
	"strconv"
	"testing"

	"github.com/inboxmill/inboxmill/dedup"
)

// BenchmarkLoneDelivery is one delivery at a time through a pipelined
// group (a group of one): its allocations are the path's own.
func BenchmarkLoneDelivery(b *testing.B) {
	f := setup(b, dedup.Group{})
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if err := f.deliver(event("b"+strconv.Itoa(i), "ok")); err != nil {
			b.Fatal(err)
		}
	}
}
