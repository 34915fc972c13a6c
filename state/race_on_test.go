//go:build race

package state

// raceEnabled shrinks the size-driven tests: the race detector makes them
// ten times slower and they test memory, not races.
const raceEnabled = true
