//go:build !race

package outboxtests

// events is how many order events the test publishes. Runs with the race
// detector (scale_race_test.go) use fewer: it slows every step several
// times, and CI runs the whole suite with it on two cores.
const events = 500
