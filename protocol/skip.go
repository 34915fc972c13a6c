package protocol

import "encoding/binary"

// skipper walks flexible response bodies without decoding them, so that the
// hot path can find out whether a Produce or Fetch response carries KIP-951
// node endpoints (a top-level tagged field) before paying for a full
// decode and re-encode. Like kbin.Reader it remembers its first error so
// callers check once at the end.
type skipper struct {
	p   []byte
	off int
	bad bool
}

func (s *skipper) skip(n int) {
	if s.bad || n < 0 || n > len(s.p)-s.off {
		s.bad = true
		return
	}
	s.off += n
}

func (s *skipper) uvarint() uint64 {
	if s.bad {
		return 0
	}
	v, n := binary.Uvarint(s.p[s.off:])
	if n <= 0 {
		s.bad = true
		return 0
	}
	s.off += n
	return v
}

// compactLen reads a compact array/string/bytes length (stored +1, 0 = null)
// and returns it, or -1 for null.
func (s *skipper) compactLen() int {
	v := s.uvarint()
	if s.bad {
		return 0
	}
	if v == 0 {
		return -1
	}
	if v-1 > uint64(len(s.p)) {
		s.bad = true
		return 0
	}
	return int(v - 1)
}

func (s *skipper) compactBytes() {
	if n := s.compactLen(); n > 0 {
		s.skip(n)
	}
}

// arrayLen reads a compact array length; an element needs at least one
// byte, which bounds hostile lengths.
func (s *skipper) arrayLen() int {
	n := s.compactLen()
	if n > len(s.p)-s.off {
		s.bad = true
		return 0
	}
	return n
}

func (s *skipper) tags() {
	n := s.uvarint()
	for i := uint64(0); i < n && !s.bad; i++ {
		s.uvarint()
		size := s.uvarint()
		if size > uint64(len(s.p)) {
			s.bad = true
			return
		}
		s.skip(int(size))
	}
}

// topLevelTagCount reads the tag count at the current offset without
// consuming it; the body must end right after the tagged fields.
func (s *skipper) topLevelTagCount() (uint64, bool) {
	if s.bad {
		return 0, false
	}
	save := s.off
	n := s.uvarint()
	if s.bad {
		return 0, false
	}
	s.off = save
	return n, true
}
