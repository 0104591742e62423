//go:build !race

package deduptest

const raceEnabled = false
