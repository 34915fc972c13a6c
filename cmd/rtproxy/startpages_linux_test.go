package main

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestReadOnlyMappingsPicksCleanReadOnlyOnes: of the executable's
// mappings, only private read-only ones without written (anonymous) pages
// are released; other files and writable or written mappings are not.
func TestReadOnlyMappingsPicksCleanReadOnlyOnes(t *testing.T) {
	smaps := `00400000-013fb000 r-xp 00000000 08:01 123 /opt/rtproxy
Size:              16364 kB
Rss:               12588 kB
Anonymous:             0 kB
013fb000-02581000 r--p 00ffb000 08:01 123 /opt/rtproxy
Rss:               12632 kB
Anonymous:             0 kB
02581000-02621000 rw-p 02181000 08:01 123 /opt/rtproxy
Rss:                 576 kB
Anonymous:           160 kB
02700000-02800000 r--p 02300000 08:01 123 /opt/rtproxy
Rss:                  64 kB
Anonymous:             4 kB
7f0000000000-7f0000100000 r-xp 00000000 08:01 456 /lib/other.so
Rss:                 100 kB
Anonymous:             0 kB
7f0000200000-7f0000300000 rw-p 00000000 00:00 0
Rss:                3636 kB
Anonymous:          3636 kB
`
	got, err := readOnlyMappings(strings.NewReader(smaps), "/opt/rtproxy")
	if err != nil {
		t.Fatal(err)
	}
	want := []mapping{{0x400000, 0x13fb000, 12588 << 10}, {0x13fb000, 0x2581000, 12632 << 10}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}

// TestReleaseStartupPagesDropsFileRSS: in this (test) process, the
// executable's resident pages leave the resident set, and the code that
// runs afterwards faults back in and works.
func TestReleaseStartupPagesDropsFileRSS(t *testing.T) {
	before := statusKB(t, "RssFile:")
	n, err := releaseStartupPages()
	if err != nil {
		t.Fatal(err)
	}
	after := statusKB(t, "RssFile:")
	if n <= 0 || after >= before {
		t.Fatalf("released %d bytes: RssFile %d kB before, %d kB after", n, before, after)
	}
	t.Logf("released %d KiB: RssFile %d -> %d kB", n>>10, before, after)
	// Still runs (code and read-only data fault back in).
	if got := strings.Repeat("ab", 3); got != "ababab" {
		t.Fatal(got)
	}
}

func statusKB(t *testing.T, field string) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field); ok {
			n, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			return n
		}
	}
	t.Fatalf("no %s in /proc/self/status", field)
	return 0
}
