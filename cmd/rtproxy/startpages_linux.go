package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// releaseStartupPages drops this process's mappings of its own executable's
// read-only pages (code and read-only data) from its resident set, once
// startup is over. Package initialisation, config parsing and the start of
// every part touch pages all over the binary, and the kernel maps 64 KiB
// around each fault: at rest an rtproxy held 25 MB of its 35 MB binary
// resident of which it referenced under 1 MB in 30 s (docs/BENCHMARKS.md,
// "Footprint"). MADV_DONTNEED on a clean private file mapping only unmaps
// the pages; they stay in the page cache, and what is used again faults
// back in. A mapping holding any page the process wrote (a relocated
// read-only segment of a dynamically linked build: Anonymous above 0) is
// left alone, since dropping it would lose the write. It returns the bytes
// released.
func releaseStartupPages() (int64, error) {
	exe, err := os.Executable()
	if err != nil {
		return 0, err
	}
	if p, err := filepath.EvalSymlinks(exe); err == nil {
		exe = p
	}
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	maps, err := readOnlyMappings(f, exe)
	if err != nil {
		return 0, err
	}
	var released int64
	for _, m := range maps {
		if _, _, errno := syscall.Syscall(syscall.SYS_MADVISE, m.start, m.end-m.start, syscall.MADV_DONTNEED); errno != 0 {
			return released, fmt.Errorf("madvise %x-%x: %w", m.start, m.end, errno)
		}
		released += m.rss
	}
	return released, nil
}

type mapping struct {
	start, end uintptr
	rss        int64 // bytes resident
}

// readOnlyMappings parses smaps for the mappings of path that are private,
// not writable, and hold no anonymous (written) page.
func readOnlyMappings(r io.Reader, path string) ([]mapping, error) {
	var (
		out  []mapping
		cur  *mapping
		anon int64
	)
	flush := func() {
		if cur != nil && anon == 0 {
			out = append(out, *cur)
		}
		cur, anon = nil, 0
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if !strings.HasSuffix(fields[0], ":") {
			// A mapping's header: "start-end perms offset dev inode path".
			flush()
			if len(fields) < 6 || strings.Join(fields[5:], " ") != path {
				continue
			}
			perms := fields[1]
			if len(perms) != 4 || perms[0] != 'r' || perms[1] != '-' || perms[3] != 'p' {
				continue
			}
			lo, hi, ok := strings.Cut(fields[0], "-")
			if !ok {
				continue
			}
			s, err1 := strconv.ParseUint(lo, 16, 64)
			e, err2 := strconv.ParseUint(hi, 16, 64)
			if err1 != nil || err2 != nil || e <= s {
				continue
			}
			cur = &mapping{start: uintptr(s), end: uintptr(e)}
			continue
		}
		if cur == nil || len(fields) < 2 {
			continue
		}
		kb, err := strconv.ParseInt(fields[1], 10, 64)
		if err != nil {
			continue
		}
		switch fields[0] {
		case "Rss:":
			cur.rss = kb << 10
		case "Anonymous:":
			anon = kb
		}
	}
	flush()
	return out, sc.Err()
}
