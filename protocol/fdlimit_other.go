//go:build !unix

package protocol

func fdLimit() uint64 { return 0 }
