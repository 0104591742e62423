//go:build race

package outboxtests

// events is scaled down under the race detector; see scale_test.go.
const events = 300
