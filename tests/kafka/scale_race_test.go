//go:build race

package kafkatests

// messages is scaled down under the race detector; see scale_test.go.
const messages = 4000
