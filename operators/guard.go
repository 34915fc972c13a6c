package operators

import "fmt"

// recoverTo is the last line of defence of every Process: a panic inside a
// step (a bug, or a value shape nobody foresaw) turns the record into a
// dead letter with ReasonError instead of taking the route down. Use it as
// `defer recoverTo(kind, r, out)`.
func recoverTo(kind string, r *Record, out Emitter) {
	if p := recover(); p != nil {
		out.DeadLetter(r, ReasonError, fmt.Errorf("%s: internal panic: %v", kind, p))
	}
}
