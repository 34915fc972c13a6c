package rules

import (
	"bufio"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// docBlock is one fenced block of docs/RULES.md with its marker.
type docBlock struct {
	kind, name string // marker: rule-file, test-file, file, refused; and the file name
	line       int    // line of the marker in RULES.md
	body       string
	want       string // refused: the ```text block that follows
}

var markerRe = regexp.MustCompile(`^<!-- (rule-file|test-file|file|refused): (\S+) -->$`)

// docBlocks reads the marked blocks. Every ```yaml block must be marked,
// so no example in the docs escapes the analyzer.
func docBlocks(t *testing.T, path string) []*docBlock {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		blocks  []*docBlock
		pending *docBlock // marker seen, block not yet
		wantFor *docBlock // refused block read, its ```text not yet
		in      *strings.Builder
		inKind  string
		lineNo  int
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lineNo++
		line := sc.Text()
		if in != nil {
			if line == "```" {
				switch {
				case inKind == "text" && wantFor != nil:
					wantFor.want = in.String()
					wantFor = nil
				case pending != nil:
					pending.body = in.String()
					blocks = append(blocks, pending)
					if pending.kind == "refused" {
						wantFor = pending
					}
					pending = nil
				}
				in = nil
				continue
			}
			in.WriteString(line + "\n")
			continue
		}
		if m := markerRe.FindStringSubmatch(line); m != nil {
			pending = &docBlock{kind: m[1], name: m[2], line: lineNo}
			continue
		}
		if lang, ok := strings.CutPrefix(line, "```"); ok {
			if lang == "yaml" && pending == nil {
				t.Errorf("%s:%d: a ```yaml block without a <!-- rule-file: NAME --> or <!-- refused: NAME --> marker", path, lineNo)
			}
			in, inKind = &strings.Builder{}, lang
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return blocks
}

// TestDocsExamples loads every full rule file shown in docs/RULES.md and
// checks that every error shown there is exactly what the analyzer says.
func TestDocsExamples(t *testing.T) {
	const doc = "../docs/RULES.md"
	blocks := docBlocks(t, doc)
	dir := t.TempDir()
	counts := map[string]int{}
	for _, b := range blocks {
		counts[b.kind]++
		writeFiles(t, dir, map[string]string{b.name: b.body})
	}
	if counts["rule-file"] < 10 || counts["refused"] < 5 {
		t.Fatalf("found %v marked blocks; the docs lost their examples", counts)
	}
	for _, b := range blocks {
		p := filepath.Join(dir, b.name)
		switch b.kind {
		case "rule-file":
			if _, err := LoadFileWith(p, docsOptions); err != nil {
				t.Errorf("%s:%d: example %s is refused:\n%v", doc, b.line, b.name, err)
			}
		case "refused":
			_, err := LoadFile(p)
			if err == nil {
				t.Errorf("%s:%d: example %s should be refused but loads", doc, b.line, b.name)
				continue
			}
			var list ErrorList
			if !errors.As(err, &list) {
				var one *Error
				if !errors.As(err, &one) {
					t.Fatalf("%T", err)
				}
				list = ErrorList{one}
			}
			var got strings.Builder
			for _, e := range list {
				got.WriteString(strings.ReplaceAll(e.Error(), dir+string(filepath.Separator), "") + "\n")
			}
			if got.String() != b.want {
				t.Errorf("%s:%d: the docs show for %s:\n%s\nthe analyzer says:\n%s", doc, b.line, b.name, b.want, got.String())
			}
		}
	}
}

// docsOptions are the options of the proxy the docs' examples run under:
// the allow-list of the config example in docs/RULES.md ("Avro and
// Protobuf") and docs/OPERATIONS.md ("What rule files may name"), and the
// endpoint of "An HTTP sink".
var docsOptions = Options{Allow: &Allow{URLs: []string{"http://registry:8081", "http://hooks.internal:8080"}, Files: []string{"/etc/rtproxy"}, EnvNames: []string{"HOOKS_TOKEN"}}}
