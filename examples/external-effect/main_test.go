package main

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var lastLine = regexp.MustCompile(`(?m)^intents=(\d+) charges=(\d+) pending_resolved=(\d+) double_charges=0\n\z`)

// TestExternalEffect runs the program with a few seeds: every chargeable
// intent is charged exactly once, although workers crash after charging,
// the provider times out after charging, and producers publish twice.
func TestExternalEffect(t *testing.T) {
	for _, seed := range []int64{1, 2, 3} {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var out bytes.Buffer
			sum, err := run(ctx, config{intents: 40, workers: 4, seed: seed}, &out)
			require.NoError(t, err, out.String())
			require.Regexp(t, lastLine, out.String())
			require.Zero(t, sum.doubleCharges)
			require.Equal(t, 40, sum.intents)
			require.Equal(t, 3, sum.declined, "intents 11, 22 and 33 are over the limit")
			require.Equal(t, sum.intents-sum.declined, sum.charges)
			require.Positive(t, sum.crashes, "the run exercised crashes after charging")
			require.Equal(t, sum.crashes, sum.fenced, "every crashed worker's late result was refused")
			require.Positive(t, sum.pendingResolved, "the run exercised uncertain outcomes")
			require.GreaterOrEqual(t, sum.takeovers, sum.crashes)
		})
	}
}
