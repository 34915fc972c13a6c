//go:build race

package protocol

// raceEnabled: the race detector is on; sync.Pool then drops items on
// purpose, so allocation counts do not hold.
const raceEnabled = true
