package rules

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// keyCellRe is a table's first cell when it names one key: `sink.topic`.
var keyCellRe = regexp.MustCompile("^`([^`]+)`$")

// rowKey is what a table row documents: its first cell, a `key` (or a
// bare word such as "metrics" before a `key`), and the second cell too
// when that is a `key` or a "(...)" as well (a step's `window` | `kind`,
// /routes' `/routes` | `state`). Rows that name no `key` are prose.
func rowKey(cells []string) (string, bool) {
	if len(cells) < 2 {
		return "", false
	}
	first, second := strings.TrimSpace(cells[0]), strings.TrimSpace(cells[1])
	firstKey := keyCellRe.MatchString(first)
	if !firstKey && (first == "" || strings.ContainsAny(first, " -")) {
		return "", false
	}
	if keyCellRe.MatchString(second) || (strings.HasPrefix(second, "(") && strings.HasSuffix(second, ")")) {
		return first + " " + second, true
	}
	return first, firstKey
}

// duplicateKeyRows lists, for every Markdown table of a document, the keys
// whose row appears more than once (first cell a single `key`), as
// "line N: `key` (first at line M)".
func duplicateKeyRows(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var dups []string
	seen := map[string]int{} // key -> line, within the current table
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(line, "|") {
			seen = map[string]int{} // a table ends at its first other line
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		key, ok := rowKey(cells)
		if !ok {
			continue
		}
		if first, dup := seen[key]; dup {
			dups = append(dups, fmt.Sprintf("line %d: %s (first at line %d)", n, key, first))
			continue
		}
		seen[key] = n
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return dups
}

// TestDocsKeysOnce: no table of the docs documents a key twice (RULES.md's
// Keys table once listed sink.topic, sink.key, sink.delivery and
// dead_letter twice, with different text).
func TestDocsKeysOnce(t *testing.T) {
	docs, err := filepath.Glob(filepath.Join("..", "docs", "*.md"))
	if err != nil || len(docs) == 0 {
		t.Fatalf("no docs: %v", err)
	}
	docs = append(docs, filepath.Join("..", "README.md"))
	for _, d := range docs {
		for _, dup := range duplicateKeyRows(t, d) {
			t.Errorf("%s: %s is documented twice in one table; merge the rows", d, dup)
		}
	}
}

// TestDuplicateKeyRows: the check itself finds a repeated key within a
// table, not across tables or in other cells.
func TestDuplicateKeyRows(t *testing.T) {
	p := filepath.Join(t.TempDir(), "d.md")
	doc := "| key | what |\n|---|---|\n| `a` | one |\n| `b` | two |\n| `a` | again |\n\n| key | what |\n|---|---|\n| `b` | another table |\n| see `a` | not a key cell |\n| `w` | `x` | one |\n| `w` | `y` | two |\n| m | `z` | three |\n| m | `z` | four |\n"
	if err := os.WriteFile(p, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	got := duplicateKeyRows(t, p)
	if len(got) != 2 || got[0] != "line 5: `a` (first at line 3)" || got[1] != "line 14: m `z` (first at line 13)" {
		t.Fatalf("duplicates %q", got)
	}
}
