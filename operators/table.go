package operators

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/rtproxy/rtproxy/internal/jsoncodec"
)

// FileTable is a join table loaded from a file: JSON lines (one object per
// line), or CSV with a header row when the file name ends in ".csv". Each
// row is indexed by the value of its key field, turned into a string like
// every key (numbers without a trailing ".0"). When two rows share a key
// the later one wins.
//
// CSV cells that parse as a number (strconv.ParseFloat) become float64 so
// that arithmetic on them works as on JSON numbers; "true" and "false"
// become bools; every other cell stays a string, and an empty cell is an
// empty string.
//
// Lookup is safe for concurrent use, also during Reload: a reload builds
// the new index to the side and swaps it in whole.
//
// The rows are kept encoded in one byte arena with a pointer-free index
// (arena.go), so a table of millions of rows costs the garbage collector
// nothing to scan; Lookup decodes the row into a new map every time.
type FileTable struct {
	path     string
	keyField string
	rows     atomic.Pointer[arenaTable]
}

// LoadFileTable loads the table at path, keyed by keyField. Errors name the
// file and line.
func LoadFileTable(path, keyField string) (*FileTable, error) {
	t := &FileTable{path: path, keyField: keyField}
	if err := t.Reload(); err != nil {
		return nil, err
	}
	return t, nil
}

// Path is the file the table reads.
func (t *FileTable) Path() string { return t.path }

// Len is the number of rows.
func (t *FileTable) Len() int { return t.rows.Load().Len() }

// Lookup implements Table. The row is a new map on every call.
func (t *FileTable) Lookup(key string) (map[string]any, bool) {
	return t.rows.Load().Lookup(key)
}

// Reload reads the file again. On error the table keeps its previous rows.
func (t *FileTable) Reload() error {
	f, err := os.Open(t.path)
	if err != nil {
		return fmt.Errorf("table %s: %w", t.path, err)
	}
	defer f.Close()
	b := newArenaBuilder()
	if err := readTable(f, t.path, t.keyField, b.add); err != nil {
		return fmt.Errorf("table %s:%w", t.path, err)
	}
	t.rows.Store(b.finish())
	return nil
}

// readTable reads a table file (CSV when path ends in ".csv", JSON lines
// otherwise) and hands each row to add, in file order.
func readTable(r io.Reader, path, keyField string, add func(key string, row map[string]any) error) error {
	if strings.EqualFold(filepath.Ext(path), ".csv") {
		return readCSVTable(r, keyField, add)
	}
	return readJSONLinesTable(r, keyField, add)
}

// readJSONLinesTable reads one JSON object per line; blank lines are
// skipped. Errors start with "<line>: " (the caller prefixes the file).
func readJSONLinesTable(r io.Reader, keyField string, add func(key string, row map[string]any) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 16<<20)
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		v, err := jsoncodec.Decode(b)
		if err != nil {
			return fmt.Errorf("%d: %w", line, err)
		}
		obj, ok := v.(map[string]any)
		if !ok {
			return fmt.Errorf("%d: row is %s, want a JSON object", line, jsonKind(v))
		}
		kv, ok := obj[keyField]
		if !ok || kv == nil {
			return fmt.Errorf("%d: row has no key field %q", line, keyField)
		}
		key, err := keyString(kv)
		if err != nil {
			return fmt.Errorf("%d: key field %q: %w", line, keyField, err)
		}
		if err := add(key, obj); err != nil {
			return fmt.Errorf("%d: %w", line, err)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%d: %w", line+1, err)
	}
	return nil
}

// readCSVTable reads a CSV file whose first row names the columns.
func readCSVTable(r io.Reader, keyField string, add func(key string, row map[string]any) error) error {
	cr := csv.NewReader(r)
	cr.ReuseRecord = false
	header, err := cr.Read()
	if errors.Is(err, io.EOF) {
		return fmt.Errorf("1: empty file, want a header row naming the columns")
	}
	if err != nil {
		return csvErr(err)
	}
	keyCol := -1
	for i, h := range header {
		if h == keyField {
			keyCol = i
		}
	}
	if keyCol < 0 {
		return fmt.Errorf("1: header %q has no key column %q", strings.Join(header, ","), keyField)
	}
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return csvErr(err)
		}
		row := make(map[string]any, len(header))
		for i, cell := range rec {
			row[header[i]] = csvCell(cell)
		}
		key := rec[keyCol]
		line, _ := cr.FieldPos(keyCol)
		if key == "" {
			return fmt.Errorf("%d: empty key column %q", line, keyField)
		}
		if k, ok := row[keyField]; ok {
			// A numeric key is indexed like a JSON number key would be.
			key, _ = keyString(k)
		}
		if err := add(key, row); err != nil {
			return fmt.Errorf("%d: %w", line, err)
		}
	}
	return nil
}

// csvErr turns a csv.ParseError into "<line>: <what>".
func csvErr(err error) error {
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		return fmt.Errorf("%d:%d: %w", pe.Line, pe.Column, pe.Err)
	}
	return err
}

func csvCell(s string) any {
	switch s {
	case "true":
		return true
	case "false":
		return false
	}
	if f, err := strconv.ParseFloat(s, 64); err == nil && s != "" && !strings.ContainsAny(s, "xXnN_") {
		return f
	}
	return s
}

// MapTable is a join table kept in memory and fed from outside: the
// pipeline fills it from a compacted topic (Set for a record, Delete for a
// tombstone). It is safe for concurrent use.
type MapTable struct {
	mu struct {
		sync.RWMutex
		rows map[string]map[string]any
	}
}

// NewMapTable returns an empty table.
func NewMapTable() *MapTable {
	t := &MapTable{}
	t.mu.rows = make(map[string]map[string]any)
	return t
}

// Set stores row under key, replacing any previous row. The table keeps
// row itself: the caller must not change it afterwards.
func (t *MapTable) Set(key string, row map[string]any) {
	t.mu.Lock()
	t.mu.rows[key] = row
	t.mu.Unlock()
}

// Delete removes key.
func (t *MapTable) Delete(key string) {
	t.mu.Lock()
	delete(t.mu.rows, key)
	t.mu.Unlock()
}

// Len is the number of rows.
func (t *MapTable) Len() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.mu.rows)
}

// Lookup implements Table.
func (t *MapTable) Lookup(key string) (map[string]any, bool) {
	t.mu.RLock()
	row, ok := t.mu.rows[key]
	t.mu.RUnlock()
	return row, ok
}
