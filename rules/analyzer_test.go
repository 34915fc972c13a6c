package rules

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// base is a valid rule file that the refusal cases below edit.
const base = `route: r1
source:
  topic: in
sink:
  topic: out
`

// loadErrors writes files into a fresh directory, loads r.yaml and returns
// its errors one per line, with the directory stripped from paths.
func loadErrors(t *testing.T, files map[string]string) []string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	r, err := LoadFile(filepath.Join(dir, "r.yaml"))
	if err == nil {
		if r == nil {
			t.Fatal("LoadFile returned neither route nor error")
		}
		return nil
	}
	if r != nil {
		t.Fatalf("LoadFile returned a route and an error: %v", err)
	}
	var list ErrorList
	var single *Error
	switch {
	case errors.As(err, &list):
	case errors.As(err, &single):
		list = ErrorList{single}
	default:
		t.Fatalf("error is %T, want *Error or ErrorList: %v", err, err)
	}
	var out []string
	for _, e := range list {
		if e.File != filepath.Join(dir, "r.yaml") {
			t.Errorf("error file = %q, want the rule file", e.File)
		}
		out = append(out, strings.ReplaceAll(e.Error(), dir+string(filepath.Separator), ""))
	}
	return out
}

func TestRefusals(t *testing.T) {
	cases := []struct {
		name  string
		file  string
		extra map[string]string
		want  []string
	}{
		{
			name: "unknown step suggests the closest",
			file: base + "steps:\n  - fliter: value.amount > 0\n",
			want: []string{"r.yaml:7:5: unknown step `fliter`; did you mean `filter`? (near `fliter`)"},
		},
		{
			name: "unknown top-level field",
			file: base + "dead_leter: x.dlq\n",
			want: []string{"r.yaml:6:1: unknown field `dead_leter` in rule file; did you mean `dead_letter`? (near `dead_leter`)"},
		},
		{
			name: "unknown source field",
			file: "route: r1\nsource: { topic: in, fromat: raw }\nsink: { topic: out }\n",
			want: []string{"r.yaml:2:22: unknown field `fromat` in source; did you mean `format`? (near `fromat`)"},
		},
		{
			name: "unknown field far from any known one lists them",
			file: base + "  colour: red\n",
			want: []string{"r.yaml:6:3: unknown field `colour` in sink; known fields: topic, http, key, delivery, format, subject, schema, message, message_indexes (near `colour`)"},
		},
		{
			name: "bad duration",
			file: "route: r1\nsource:\n  topic: in\n  watermark: 10 seconds\nsink: { topic: out }\n",
			want: []string{"r.yaml:4:14: bad duration for `source.watermark`: write a number with a unit, e.g. 500ms, 30s, 5m or 1h (near `10 seconds`)"},
		},
		{
			name: "negative duration",
			file: base + "checkpoint_interval: -5s\n",
			want: []string{"r.yaml:6:22: `checkpoint_interval` must be greater than zero (near `-5s`)"},
		},
		{
			name: "unknown name in a plain scalar, column inside the expression",
			file: base + "steps:\n  - filter: value.amount > 0 && valu.status == \"ok\"\n",
			want: []string{"r.yaml:7:33: filter does not compile: unknown name valu; did you mean `value`? (near `value.amount > 0 && valu.status == \"ok\"`)"},
		},
		{
			name: "syntax error in a quoted scalar",
			file: base + "steps:\n  - filter: 'value.a > > 1'\n",
			want: []string{"r.yaml:7:24: filter does not compile: unexpected token Operator(\">\") (near `value.a > > 1`)"},
		},
		{
			name: "unknown name in a double-quoted scalar",
			file: base + "steps:\n  - filter: \"value.a == 1 || vlue.b\"\n",
			want: []string{"r.yaml:7:30: filter does not compile: unknown name vlue; did you mean `value`? (near `value.a == 1 || vlue.b`)"},
		},
		{
			name: "join without as binds the table name, which must be usable",
			file: base + "tables:\n  my-table: { topic: t }\nsteps:\n  - join: { table: my-table, on: key }\n",
			want: []string{"r.yaml:9:5: join needs `as`: table `my-table` cannot be used as a name in expressions (near `my-table`)"},
		},
		{
			name: "a ` #` in a plain scalar starts a YAML comment",
			file: base + "steps:\n  - set:\n      total: sum(value.items, #.price)\n",
			want: []string{"r.yaml:8:29: set total does not compile: unexpected token EOF; YAML read `#.price)` as a comment, so quote the expression or use the block form (near `sum(value.items,`)"},
		},
		{
			name: "event_time of the wrong type",
			file: "route: r1\nsource: { topic: in, event_time: value.ts > 0 }\nsink: { topic: out }\n",
			want: []string{"r.yaml:2:34: source.event_time gives bool; it must give epoch milliseconds (a number), an RFC 3339 string or a time, e.g. `value.ts` (near `value.ts > 0`)"},
		},
		{
			name: "syntax error in a literal block is placed on its line",
			file: base + "steps:\n  - filter: |\n      value.a > 1 &&\n        value.b ==\n",
			want: []string{"r.yaml:9:19: filter does not compile: unexpected token EOF (near `value.a > 1 && …`)"},
		},
		{
			name: "filter that is not boolean",
			file: base + "steps:\n  - filter: len(key)\n",
			want: []string{"r.yaml:7:13: filter must be true or false (expected bool, but got int); write a condition such as `value.amount > 0` (near `len(key)`)"},
		},
		{
			name: "join to an undefined table",
			file: base + "tables:\n  merchants: { topic: merchants }\nsteps:\n  - join: { table: merchant, on: value.m, as: m }\n",
			want: []string{"r.yaml:9:20: join to undefined table `merchant`; did you mean `merchants`? (near `merchant`)"},
		},
		{
			name: "join with no tables at all",
			file: base + "steps:\n  - join: { table: prices, on: value.sku, as: price }\n",
			want: []string{"r.yaml:7:20: join to undefined table `prices`; define it under `tables:` (`prices: { file: prices.jsonl, key: id }`) (near `prices`)"},
		},
		{
			name: "join as shadowing a built-in name",
			file: base + "tables:\n  m: { topic: merchants }\nsteps:\n  - join: { table: m, on: value.m, as: value }\n",
			want: []string{"r.yaml:9:40: join `as: value` would hide the built-in `value`; choose another name, e.g. `value_row` (near `value`)"},
		},
		{
			name: "join as shadowing an expr function",
			file: base + "tables:\n  m: { topic: merchants }\nsteps:\n  - join: { table: m, on: value.m, as: len }\n",
			want: []string{"r.yaml:9:40: join `as: len` would hide the expr-lang function `len`; choose another name (near `len`)"},
		},
		{
			name: "join bound name used after the join, misspelled",
			file: base + "tables:\n  m: { topic: merchants }\nsteps:\n  - join: { table: m, on: value.m, as: merchant }\n  - set: { avg: merchnt.avg }\n",
			want: []string{"r.yaml:10:17: set avg does not compile: unknown name merchnt; did you mean `merchant`? (near `merchnt.avg`)"},
		},
		{
			name: "slide on a tumbling window",
			file: base + "steps:\n  - window:\n      kind: tumbling\n      size: 1m\n      slide: 10s\n      aggregate: { n: count() }\n",
			want: []string{"r.yaml:10:7: `slide` only applies to sliding windows; remove it or use `kind: sliding` (near `slide`)"},
		},
		{
			name: "slide larger than size",
			file: base + "steps:\n  - window:\n      kind: sliding\n      size: 1m\n      slide: 5m\n      aggregate: { n: count() }\n",
			want: []string{"r.yaml:10:14: `slide` (5m0s) is larger than `size` (1m0s), so some records would fall in no window; make slide at most size (near `5m`)"},
		},
		{
			name: "sliding window with too many windows per record",
			file: base + "steps:\n  - window:\n      kind: sliding\n      size: 1h\n      slide: 1ms\n      aggregate: { n: count() }\n",
			want: []string{"r.yaml:10:14: a `size` of 1h0m0s sliding by 1ms puts every record in 3600000 windows, more than 10000; use a larger slide (near `1ms`)"},
		},
		{
			name: "sliding without slide",
			file: base + "steps:\n  - window:\n      kind: sliding\n      size: 1m\n      aggregate: { n: count() }\n",
			want: []string{"r.yaml:7:5: a sliding window needs `slide`: how far apart windows start, e.g. `slide: 1m` (at most `size`) (near `window`)"},
		},
		{
			name: "aggregate outside window.aggregate",
			file: base + "steps:\n  - filter: sum(value.amount) > 100\n",
			want: []string{"r.yaml:7:13: filter uses the aggregate `sum(...)`, which only works inside `window.aggregate`; aggregate in a window step, or use an expr-lang function here (near `sum(value.amount) > 100`)"},
		},
		{
			name: "aggregate nested in a map expression",
			file: base + "steps:\n  - map: { total: 1 + avg(value.amount) }\n",
			want: []string{"r.yaml:7:23: map total uses the aggregate `avg(...)`, which only works inside `window.aggregate`; aggregate in a window step, or use an expr-lang function here (near `1 + avg(value.amount)`)"},
		},
		{
			name: "aggregate entry that is not exactly one aggregate call",
			file: base + "steps:\n  - window:\n      kind: tumbling\n      size: 1m\n      aggregate:\n        n: count() * 2\n",
			want: []string{"r.yaml:11:12: aggregate n must be exactly one aggregate call, such as `count()` or `sum(value.amount)`; compute around it in a later step (`set`/`map` after the window) (near `count() * 2`)"},
		},
		{
			name: "aggregate entry with the wrong number of arguments",
			file: base + "steps:\n  - window:\n      kind: tumbling\n      size: 1m\n      aggregate:\n        total: sum(value.a, value.b)\n",
			want: []string{"r.yaml:11:16: aggregate total: `sum` takes exactly one argument, e.g. `sum(value.amount)` (near `sum(value.a, value.b)`)"},
		},
		{
			name: "aggregate argument that does not compile points into the argument",
			file: base + "steps:\n  - window:\n      kind: tumbling\n      size: 1m\n      aggregate:\n        total: sum(vlue.amount)\n",
			want: []string{"r.yaml:11:20: aggregate total does not compile: unknown name vlue; did you mean `value`? (near `vlue.amount`)"},
		},
		{
			name: "sink equal to source",
			file: "route: r1\nsource: { topic: payments }\nsink: { topic: payments }\n",
			want: []string{"r.yaml:3:16: sink topic is the source topic; the route would read its own output forever. Write results to another topic, e.g. `payments.out` (near `payments`)"},
		},
		{
			name: "dead_letter equal to source",
			file: base + "dead_letter: in\n",
			want: []string{"r.yaml:6:14: dead_letter topic is the source topic; dead letters would be read again as input. Choose another topic, e.g. `in.dlq` (near `in`)"},
		},
		{
			name: "dead_letter equal to sink",
			file: base + "dead_letter: out\n",
			want: []string{"r.yaml:6:14: dead_letter topic is the sink topic; dead letters would mix with results. Choose another topic, e.g. `in.dlq` (near `out`)"},
		},
		{
			name: "missing route",
			file: "source: { topic: in }\nsink: { topic: out }\n",
			want: []string{"r.yaml:1:1: missing `route`: name the route (letters, digits, `.`, `_`, `-`), e.g. `route: payments-risk`"},
		},
		{
			name: "missing source.topic",
			file: "route: r1\nsource:\n  format: raw\nsink: { topic: out }\n",
			want: []string{"r.yaml:2:1: missing `source.topic`: the topic this route reads (near `source`)"},
		},
		{
			name: "missing sink.topic",
			file: "route: r1\nsource: { topic: in }\nsink:\n  key: key\n",
			want: []string{"r.yaml:3:1: missing `sink.topic`: the topic results go to (or `sink.http`: an HTTP endpoint) (near `sink`)"},
		},
		{
			name: "missing source and sink",
			file: "route: r1\n",
			want: []string{
				"r.yaml:1:1: missing `source`: name the topic this route reads, e.g. `source: { topic: payments }`",
				"r.yaml:1:1: missing `sink`: name the topic results go to, e.g. `sink: { topic: payments.risk }`",
			},
		},
		{
			name:  "table file that does not parse reports its own line",
			file:  base + "tables:\n  merchants: { file: merchants.jsonl, key: id }\n",
			extra: map[string]string{"merchants.jsonl": "{\"id\": \"m1\"}\n{\"name\": \"no id\"}\n"},
			want:  []string{"r.yaml:7:22: table `merchants` cannot be loaded: merchants.jsonl:2: row has no key field \"id\"; fix the table file or the `key` (near `merchants.jsonl`)"},
		},
		{
			name: "table file that does not exist",
			file: base + "tables:\n  merchants: { file: nowhere.csv, key: id }\n",
			want: []string{"r.yaml:7:22: table `merchants` cannot be loaded: nowhere.csv: no such file or directory; fix the table file or the `key` (near `nowhere.csv`)"},
		},
		{
			name: "YAML syntax error has line and column",
			file: base + "steps:\n  - filter: value.a: 1\n",
			want: []string{"r.yaml:7:20: YAML syntax error: mapping values are not allowed in this context; an expression containing `: `, `#` or a leading YAML indicator must be quoted or written in block form (`filter: |` and the expression on the next line) (near `- filter: value.a: 1`)"},
		},
		{
			name: "a field after a map that the map did not produce",
			file: base + "steps:\n  - map: { user: value.user, amount: value.amount }\n  - filter: value.amout > 10\n",
			want: []string{"r.yaml:8:19: filter reads `value.amout`, but after the map at line 7 value has only the fields user, amount (near `value.amout > 10`)"},
		},
		{
			name: "steps after a window see window rows",
			file: base + "steps:\n  - window: { kind: tumbling, size: 1m, key: value.user, aggregate: { n: count() } }\n  - filter: value.amount > 1\n",
			want: []string{"r.yaml:8:19: filter reads `value.amount`, but after the window at line 7 value has only the fields key, window_start, window_end, n (near `value.amount > 1`)"},
		},
		{
			name: "join names are gone after a window",
			file: base + "tables:\n  m: { topic: merchants }\nsteps:\n  - join: { table: m, on: value.m, as: merchant }\n  - window: { kind: tumbling, size: 1m, aggregate: { n: count() } }\n  - set: { name: merchant.name }\n",
			want: []string{"r.yaml:11:18: set name does not compile: unknown name merchant; an expression sees key, value, headers, timestamp, topic, partition, offset, size (near `merchant.name`)"},
		},
		{
			name: "raw format value has no fields",
			file: "route: r1\nsource: { topic: in, format: raw }\nsink: { topic: out }\nsteps:\n  - filter: value.a == 1\n",
			want: []string{"r.yaml:5:19: filter reads `value.a`, but with `format: raw` value is a string; use `format: json` or work on the string (near `value.a == 1`)"},
		},
		{
			name: "a field written twice",
			file: base + "sink:\n  topic: out2\n",
			want: []string{"r.yaml:6:1: `sink` is written twice in rule file (first at line 4); keep one (near `sink`)"},
		},
		{
			name: "unquoted expression with ': ' becomes a mapping",
			file: base + "steps:\n  - set:\n      label: value.kind == 'a' ? 'x': 'y'\n",
			want: []string{"r.yaml:8:37: YAML syntax error: mapping values are not allowed in this context; an expression containing `: `, `#` or a leading YAML indicator must be quoted or written in block form (`filter: |` and the expression on the next line) (near `label: value.kind == 'a' ? 'x': 'y'`)"},
		},
		{
			name: "enumerated value suggests",
			file: "route: r1\nsource: { topic: in, start: earlist }\nsink: { topic: out }\n",
			want: []string{"r.yaml:2:29: `source.start` must be one of earliest, latest; did you mean `earliest`? (near `earlist`)"},
		},
		{
			name: "empty file",
			file: "",
			want: []string{"r.yaml:1:1: empty rule file: a rule file needs at least `route`, `source.topic` and `sink.topic`"},
		},
		{
			name: "two documents",
			file: base + "---\nroute: r2\n",
			want: []string{"r.yaml:6:1: a rule file holds one YAML document (one route); move this document to its own file (near `---`)"},
		},
		{
			name: "a step with two operators",
			file: base + "steps:\n  - filter: true\n    map: { a: 1 }\n",
			want: []string{"r.yaml:8:5: a step holds exactly one operator; start `map` on its own list item (`- map: ...`) (near `map`)"},
		},
		{
			name: "several errors in one file are all reported in order",
			file: "route: bad name\nsource: { topic: in, watermark: 5 }\nsink: { topic: in }\n",
			want: []string{
				"r.yaml:1:8: route name may contain only letters, digits, `.`, `_` and `-` (at most 200) (near `bad name`)",
				"r.yaml:2:33: bad duration for `source.watermark`: write a number with a unit, e.g. 500ms, 30s, 5m or 1h (near `5`)",
				"r.yaml:3:16: sink topic is the source topic; the route would read its own output forever. Write results to another topic, e.g. `in.out` (near `in`)",
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			files := map[string]string{"r.yaml": c.file}
			for k, v := range c.extra {
				files[k] = v
			}
			got := loadErrors(t, files)
			if strings.Join(got, "\n") != strings.Join(c.want, "\n") {
				t.Errorf("errors:\n got: %s\nwant: %s", strings.Join(got, "\n      "), strings.Join(c.want, "\n      "))
			}
		})
	}
}

// Accepted plans the refusals above must not catch.
func TestAccepted(t *testing.T) {
	cases := map[string]string{
		"join without as binds the table name":  base + "tables:\n  merchants: { topic: m }\nsteps:\n  - join: { table: merchants, on: value.m }\n  - set:\n      name: merchants?.name\n",
		"window without event_time":             base + "steps:\n  - window: { kind: tumbling, size: 1m, aggregate: { n: count() } }\n",
		"expr-lang builtins in their own forms": base + "steps:\n  - set:\n      hi: max(value.a, value.b)\n      lo: min(1, 2, 3)\n      total: 'sum(value.items, #.price)'\n      ok: |\n        count(value.items, #.ok)\n",
		"sliding with slide equal to size":      base + "steps:\n  - window: { kind: sliding, size: 1m, slide: 1m, key: key, aggregate: { n: count() } }\n",
		"set after map extends the known shape": base + "steps:\n  - map: { a: value.a }\n  - set: { b: value.a + 1 }\n  - filter: value.b > value.a\n",
		"raw value used as a string":            "route: r1\nsource: { topic: in, format: raw }\nsink: { topic: out }\nsteps:\n  - filter: value startsWith \"ERROR\"\n  - map: { line: value }\n  - filter: len(value.line) > 3\n",
		"anchors and aliases":                   "route: r1\nsource: { topic: in }\nsink: { topic: out }\nsteps:\n  - filter: &cond value.a > 1\n  - map: { passed: *cond }\n",
		"empty steps and tables":                base + "tables:\nsteps:\n",
		"event_time as number, string or any":   "route: r1\nsource: { topic: in, event_time: timestamp - 1000 }\nsink: { topic: out }\n",
		"event_time as a string":                "route: r1\nsource:\n  topic: in\n  event_time: headers[\"ts\"]\nsink: { topic: out }\n",
	}
	for name, file := range cases {
		t.Run(name, func(t *testing.T) {
			if errs := loadErrors(t, map[string]string{"r.yaml": file}); errs != nil {
				t.Errorf("refused:\n%s", strings.Join(errs, "\n"))
			}
		})
	}
}
