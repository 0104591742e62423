//go:build !race

package kafkatests

// messages is how many Kafka messages the end-to-end tests publish. Runs
// with the race detector (scale_race_test.go) use fewer: it slows every
// delivery several times, and CI runs the whole suite with it on two cores.
const messages = 20000
