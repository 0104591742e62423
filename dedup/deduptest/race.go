//go:build race

package deduptest

// raceEnabled scales the volume tests down under the race detector, which
// slows SQLite (a C library compiled to Go) and the drivers by an order of
// magnitude; the full volumes run without it.
const raceEnabled = true
