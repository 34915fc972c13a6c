//go:build !unix

package protocol

// rawReads is off: connReader reads through net.Conn.Read here.
var rawReads = false

func rawRead(uintptr, []byte) (int, error) { panic("raw reads are unix only") }
