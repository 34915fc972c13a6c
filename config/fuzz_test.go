package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// FuzzParse feeds arbitrary bytes to the config parser. It must never panic;
// an error must carry the file name; a document it accepts must render
// (YAML) and parse back to the same value.
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob("testdata/*.yaml")
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("tls: {client: {cert_file: a, key_file: b}}\n"))
	f.Add([]byte("upstream: &u [a:1]\nlisten: *u\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c := Default()
		err := c.Parse("fuzz.yaml", data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "fuzz.yaml") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		_ = c.Validate()
		back := Default()
		if err := back.Parse("back.yaml", c.YAML()); err != nil {
			t.Fatalf("accepted config does not re-parse: %v\n%s", err, c.YAML())
		}
		if !reflect.DeepEqual(back, c) {
			t.Fatalf("round trip differs:\n%#v\n%#v", c, back)
		}
	})
}
