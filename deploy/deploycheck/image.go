package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/rtproxy/rtproxy/config"
)

// Instruction is one Dockerfile instruction, continuation lines joined.
type Instruction struct {
	Line  int    // 1-based line of its first line
	Cmd   string // upper case: FROM, RUN, COPY, ...
	Args  string // the rest, verbatim
	Stage int    // index of the FROM it belongs to (-1 before the first)
}

// Dockerfile is a parsed Dockerfile: just enough for the checks below.
type Dockerfile struct {
	Instructions []Instruction
	Stages       []Stage
	GlobalArgs   map[string]string // ARG defaults declared before the first FROM
}

// Stage is one FROM … [AS name] block.
type Stage struct {
	Image string // with global ARG defaults substituted
	Name  string
}

// ParseDockerfile reads instructions, joining lines ending in a backslash
// and skipping comments and blank lines.
func ParseDockerfile(r io.Reader) (*Dockerfile, error) {
	df := &Dockerfile{GlobalArgs: map[string]string{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	lineNo, start := 0, 0
	var cur strings.Builder
	flush := func() error {
		text := strings.TrimSpace(cur.String())
		cur.Reset()
		if text == "" {
			return nil
		}
		cmd, args, _ := strings.Cut(text, " ")
		in := Instruction{Line: start, Cmd: strings.ToUpper(cmd), Args: strings.TrimSpace(args), Stage: len(df.Stages) - 1}
		switch in.Cmd {
		case "FROM":
			f := strings.Fields(in.Args)
			var st Stage
			for i := 0; i < len(f); i++ {
				if strings.HasPrefix(f[i], "--") {
					continue
				}
				if st.Image == "" {
					st.Image = df.expand(f[i])
				} else if strings.EqualFold(f[i], "as") && i+1 < len(f) {
					st.Name = f[i+1]
					break
				}
			}
			if st.Image == "" {
				return fmt.Errorf("line %d: FROM without an image", start)
			}
			df.Stages = append(df.Stages, st)
			in.Stage = len(df.Stages) - 1
		case "ARG":
			if len(df.Stages) == 0 {
				k, v, _ := strings.Cut(in.Args, "=")
				df.GlobalArgs[k] = v
			}
		}
		df.Instructions = append(df.Instructions, in)
		return nil
	}
	for sc.Scan() {
		lineNo++
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") {
			continue
		}
		if cur.Len() == 0 {
			if trimmed == "" {
				continue
			}
			start = lineNo
		}
		if strings.HasSuffix(trimmed, "\\") {
			cur.WriteString(strings.TrimSuffix(trimmed, "\\"))
			cur.WriteString(" ")
			continue
		}
		cur.WriteString(trimmed)
		if err := flush(); err != nil {
			return nil, err
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if err := flush(); err != nil {
		return nil, err
	}
	if len(df.Stages) == 0 {
		return nil, errors.New("no FROM instruction")
	}
	return df, nil
}

var argRef = regexp.MustCompile(`\$\{(\w+)\}|\$(\w+)`)

func (df *Dockerfile) expand(s string) string {
	return argRef.ReplaceAllStringFunc(s, func(m string) string {
		k := strings.Trim(m, "${}")
		if v, ok := df.GlobalArgs[k]; ok {
			return v
		}
		return m
	})
}

// final returns the instructions of the last stage with the given command.
func (df *Dockerfile) final(cmd string) []Instruction {
	var out []Instruction
	for _, in := range df.Instructions {
		if in.Stage == len(df.Stages)-1 && in.Cmd == cmd {
			out = append(out, in)
		}
	}
	return out
}

// execForm decodes a JSON array argument (CMD, ENTRYPOINT, VOLUME).
func execForm(in Instruction) ([]string, error) {
	var out []string
	if err := json.Unmarshal([]byte(in.Args), &out); err != nil {
		return nil, fmt.Errorf("line %d: %s %s is not in exec (JSON array) form", in.Line, in.Cmd, in.Args)
	}
	return out, nil
}

// shellWords splits a RUN line the way sh would for the simple words used in
// a build command: whitespace separates, double and single quotes group.
func shellWords(s string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	var quote rune
	for _, r := range s {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case r == '"' || r == '\'':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated %c quote in %q", quote, s)
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}

// BuildCommand is the Dockerfile's `go build` line taken apart.
type BuildCommand struct {
	Line    int
	Env     []string // NAME=value words before `go`
	Args    []string // after `go`: build, flags, package
	Output  string   // the -o value
	LDFlags string
	Package string
}

// GoBuild finds the single RUN … go build … line.
func (df *Dockerfile) GoBuild() (*BuildCommand, error) {
	var found []*BuildCommand
	for _, in := range df.Instructions {
		if in.Cmd != "RUN" || !strings.Contains(in.Args, "go build") {
			continue
		}
		words, err := shellWords(in.Args)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", in.Line, err)
		}
		bc := &BuildCommand{Line: in.Line}
		i := 0
		for ; i < len(words) && strings.HasPrefix(words[i], "--"); i++ { // RUN --mount=…
		}
		for ; i < len(words) && strings.Contains(words[i], "=") && words[i] != "go"; i++ {
			bc.Env = append(bc.Env, words[i])
		}
		if i+1 >= len(words) || words[i] != "go" || words[i+1] != "build" {
			return nil, fmt.Errorf("line %d: want `[NAME=value…] go build …` as the whole RUN, got %q", in.Line, in.Args)
		}
		bc.Args = words[i+1:]
		for j := 1; j < len(bc.Args); j++ {
			switch a := bc.Args[j]; {
			case a == "-o" && j+1 < len(bc.Args):
				bc.Output = bc.Args[j+1]
				j++
			case a == "-ldflags" && j+1 < len(bc.Args):
				bc.LDFlags = bc.Args[j+1]
				j++
			case strings.HasPrefix(a, "-ldflags="):
				bc.LDFlags = strings.TrimPrefix(a, "-ldflags=")
			case !strings.HasPrefix(a, "-"):
				bc.Package = a
			}
		}
		found = append(found, bc)
	}
	if len(found) != 1 {
		return nil, fmt.Errorf("want exactly one RUN with `go build`, found %d", len(found))
	}
	return found[0], nil
}

// ImageCheck names the inputs of CheckImage.
type ImageCheck struct {
	Dockerfile   string
	Dockerignore string
	Rendered     string // helm template output, standalone mode
	ImageConfig  string // the config file the image carries
	BuildOut     string // if set, run the build command here
	Version      string
	Log          io.Writer
}

// StaticBase is the runtime image the project ships on.
const StaticBase = "gcr.io/distroless/static-debian12:nonroot"

// NonRootUID is distroless's "nonroot" user.
const NonRootUID = 65532

// CheckImage compares the Dockerfile with the rendered chart and the image's
// default config, and optionally runs its build command.
func CheckImage(ic ImageCheck) ([]string, error) {
	f, err := os.Open(ic.Dockerfile)
	if err != nil {
		return nil, err
	}
	df, err := ParseDockerfile(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ic.Dockerfile, err)
	}
	m, err := LoadManifest(ic.Rendered)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ic.Rendered, err)
	}
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	// The chart side: its config, its proxy container.
	configs, _ := m.configMaps()
	pods := m.pods()
	if len(configs) != 1 || len(pods) != 1 {
		return nil, fmt.Errorf("%s: want one config ConfigMap and one rtproxy pod (render the chart in standalone mode), found %d and %d", ic.Rendered, len(configs), len(pods))
	}
	chartCfg := config.Default()
	if err := chartCfg.Parse("chart "+ConfigKey, []byte(str(configs[0], "data", ConfigKey))); err != nil {
		return nil, err
	}
	c := pods[0].container
	var chartArgs []string
	for _, a := range list(c, "args") {
		s, _ := a.(string)
		chartArgs = append(chartArgs, s)
	}

	// Stages and base images.
	final := df.Stages[len(df.Stages)-1]
	if final.Image != StaticBase {
		bad("Dockerfile: final stage FROM %s, want %s (static, non-root)", final.Image, StaticBase)
	}
	bc, err := df.GoBuild()
	if err != nil {
		bad("Dockerfile: %v", err)
	} else {
		if st := df.Stages[df.Instructions[slices.IndexFunc(df.Instructions, func(in Instruction) bool { return in.Line == bc.Line })].Stage]; !strings.HasPrefix(st.Image, "golang:") {
			bad("Dockerfile line %d: go build runs in a stage FROM %s, want a golang: builder", bc.Line, st.Image)
		}
		if !slices.Contains(bc.Env, "CGO_ENABLED=0") {
			bad("Dockerfile line %d: go build without CGO_ENABLED=0 (env %q): the binary would link libc, which distroless/static lacks", bc.Line, bc.Env)
		}
		if !slices.Contains(bc.Args, "-trimpath") {
			bad("Dockerfile line %d: go build without -trimpath", bc.Line)
		}
		ld := strings.Fields(bc.LDFlags)
		if !slices.Contains(ld, "-s") || !slices.Contains(ld, "-w") {
			bad("Dockerfile line %d: -ldflags %q lacks -s -w", bc.Line, bc.LDFlags)
		}
		if !strings.Contains(bc.LDFlags, "-X main.version=${VERSION}") {
			bad("Dockerfile line %d: -ldflags %q does not stamp -X main.version=${VERSION}", bc.Line, bc.LDFlags)
		}
		if bc.Package != "./cmd/rtproxy" {
			bad("Dockerfile line %d: builds %q, want ./cmd/rtproxy", bc.Line, bc.Package)
		}
	}

	// The binary reaches the final stage and is the entrypoint.
	entry := ""
	if ins := df.final("ENTRYPOINT"); len(ins) != 1 {
		bad("Dockerfile: want one ENTRYPOINT in the final stage, found %d", len(ins))
	} else if e, err := execForm(ins[0]); err != nil {
		bad("Dockerfile: %v", err)
	} else if len(e) != 1 {
		bad("Dockerfile line %d: ENTRYPOINT %q, want just the binary (the chart passes args, keeping the entrypoint)", ins[0].Line, e)
	} else {
		entry = e[0]
	}
	copies := df.final("COPY")
	copied := func(dst string) (Instruction, []string, bool) {
		for _, in := range copies {
			w := strings.Fields(in.Args)
			var flags, paths []string
			for _, x := range w {
				if strings.HasPrefix(x, "--") {
					flags = append(flags, x)
				} else {
					paths = append(paths, x)
				}
			}
			if len(paths) >= 2 && paths[len(paths)-1] == dst {
				return in, append(flags, paths[:len(paths)-1]...), true
			}
		}
		return Instruction{}, nil, false
	}
	if entry != "" && bc != nil {
		if _, srcs, ok := copied(entry); !ok || !slices.Contains(srcs, bc.Output) {
			bad("Dockerfile: ENTRYPOINT %s is not the go build output %s copied into the final stage", entry, bc.Output)
		}
	}

	// CMD is what the chart passes as args.
	if ins := df.final("CMD"); len(ins) != 1 {
		bad("Dockerfile: want one CMD in the final stage, found %d", len(ins))
	} else if cmd, err := execForm(ins[0]); err != nil {
		bad("Dockerfile: %v", err)
	} else {
		if !slices.Equal(cmd, chartArgs) {
			bad("Dockerfile line %d: CMD %q but the chart runs the container with args %q", ins[0].Line, cmd, chartArgs)
		}
		if len(cmd) == 3 && cmd[0] == "run" && cmd[1] == "--config" {
			in, srcs, ok := copied(cmd[2])
			switch {
			case !ok:
				bad("Dockerfile: CMD reads %s but no COPY puts a config there", cmd[2])
			case !slices.Contains(srcs, filepath.ToSlash(ic.ImageConfig)):
				bad("Dockerfile line %d: %s comes from %q, want %s", in.Line, cmd[2], srcs, ic.ImageConfig)
			}
		} else {
			bad("Dockerfile line %d: CMD %q, want [run --config PATH]", ins[0].Line, cmd)
		}
	}

	// User: distroless nonroot, the same uid the chart runs as.
	if ins := df.final("USER"); len(ins) != 1 {
		bad("Dockerfile: want one USER in the final stage, found %d", len(ins))
	} else {
		uid, gid, _ := strings.Cut(ins[0].Args, ":")
		if uid != strconv.Itoa(NonRootUID) || (gid != "" && gid != strconv.Itoa(NonRootUID)) {
			bad("Dockerfile line %d: USER %s, want %d:%d (distroless nonroot)", ins[0].Line, ins[0].Args, NonRootUID, NonRootUID)
		}
		for _, where := range []any{get(c, "securityContext"), get(pods[0].spec, "securityContext")} {
			for _, field := range []string{"runAsUser", "runAsGroup"} {
				if v, ok := num(where, field); ok && v != NonRootUID {
					bad("chart securityContext.%s is %d but the image's USER is %s", field, v, ins[0].Args)
				}
			}
		}
	}

	// Paths: state is a volume the user owns; rules dir exists and is owned too.
	var volumes []string
	for _, in := range df.final("VOLUME") {
		v, err := execForm(in)
		if err != nil {
			bad("Dockerfile: %v", err)
		}
		volumes = append(volumes, v...)
	}
	if !slices.Equal(volumes, []string{chartCfg.StateDir}) {
		bad("Dockerfile: VOLUME %q, want exactly the chart's state_dir %q", volumes, chartCfg.StateDir)
	}
	for _, dir := range []string{chartCfg.StateDir, chartCfg.RulesDir} {
		in, flags, ok := copied(dir)
		if !ok {
			bad("Dockerfile: the final stage never creates %s (COPY --chown=%d:%d … %s)", dir, NonRootUID, NonRootUID, dir)
		} else if !slices.Contains(flags, fmt.Sprintf("--chown=%d:%d", NonRootUID, NonRootUID)) {
			bad("Dockerfile line %d: %s is not --chown=%d:%d", in.Line, dir, NonRootUID, NonRootUID)
		}
	}

	// The image's own config agrees with the chart's on everything but the
	// addresses that depend on where it runs.
	imgCfg := config.Default()
	if err := imgCfg.LoadFile(ic.ImageConfig); err != nil {
		bad("%s: %v", ic.ImageConfig, err)
	} else if err := imgCfg.Validate(); err != nil {
		bad("%s: %v", ic.ImageConfig, err)
	} else {
		same := []struct {
			key        string
			img, chart any
		}{
			{"rules_dir", imgCfg.RulesDir, chartCfg.RulesDir},
			{"state_dir", imgCfg.StateDir, chartCfg.StateDir},
			{"listen port", portOf(imgCfg.Listen), portOf(chartCfg.Listen)},
			{"admin_listen", imgCfg.AdminListen, chartCfg.AdminListen},
			{"broker_ports", imgCfg.BrokerPorts, chartCfg.BrokerPorts},
			{"broker_port_count", imgCfg.BrokerPortCount, chartCfg.BrokerPortCount},
		}
		for _, s := range same {
			if s.img != s.chart {
				bad("%s: %s is %v, the chart renders %v", ic.ImageConfig, s.key, s.img, s.chart)
			}
		}
		if h, _, _ := net.SplitHostPort(imgCfg.Listen); h != "0.0.0.0" && h != "" {
			bad("%s: listen %s is unreachable from outside the container", ic.ImageConfig, imgCfg.Listen)
		}
	}

	// EXPOSE: the bootstrap, broker range and admin ports of the chart.
	var exposed []int
	for _, in := range df.final("EXPOSE") {
		for _, w := range strings.Fields(in.Args) {
			w = strings.TrimSuffix(w, "/tcp")
			lo, hi, isRange := strings.Cut(w, "-")
			a, err1 := strconv.Atoi(lo)
			b := a
			var err2 error
			if isRange {
				b, err2 = strconv.Atoi(hi)
			}
			if err1 != nil || err2 != nil || b < a {
				bad("Dockerfile line %d: EXPOSE %q is not a port or range", in.Line, w)
				continue
			}
			for p := a; p <= b; p++ {
				exposed = append(exposed, p)
			}
		}
	}
	sort.Ints(exposed)
	want := []int{portOf(chartCfg.Listen), portOf(chartCfg.AdminListen)}
	for p := chartCfg.BrokerPorts; p < chartCfg.BrokerPorts+chartCfg.BrokerPortCount; p++ {
		want = append(want, p)
	}
	sort.Ints(want)
	if !slices.Equal(exposed, want) {
		bad("Dockerfile: EXPOSE %s, but the chart's default config listens on %s", ranges(exposed), ranges(want))
	}

	// .dockerignore must not hide anything the build needs.
	if bc != nil {
		problems = append(problems, checkDockerignore(ic.Dockerignore, bc.Package, ic.ImageConfig)...)
	}

	if ic.BuildOut != "" && bc != nil {
		if err := runBuild(bc, ic.BuildOut, ic.Version, ic.Log); err != nil {
			bad("running the Dockerfile's build command: %v", err)
		}
	}
	return problems, nil
}

// runBuild runs the Dockerfile's go build on this host with -o replaced.
func runBuild(bc *BuildCommand, out, version string, log io.Writer) error {
	args := slices.Clone(bc.Args)
	for i := range args {
		if i > 0 && args[i-1] == "-o" {
			args[i] = out
		}
		args[i] = strings.ReplaceAll(args[i], "${VERSION}", version)
	}
	goBin := filepath.Join(goroot(), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		goBin = "go"
	}
	cmd := exec.Command(goBin, args...)
	cmd.Env = append(os.Environ(), bc.Env...)
	cmd.Stdout, cmd.Stderr = log, log
	fmt.Fprintf(log, "deploycheck image: %s go %s\n", strings.Join(bc.Env, " "), strings.Join(args, " "))
	return cmd.Run()
}

func goroot() string {
	if r := os.Getenv("GOROOT"); r != "" {
		return r
	}
	out, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		return "/usr/local/go"
	}
	return strings.TrimSpace(string(out))
}

// checkDockerignore lists the module directories the binary is built from
// (go list -deps) and the context files the final stage copies, and reports
// any that a .dockerignore pattern would leave out of the build context.
func checkDockerignore(path, pkg string, contextFiles ...string) []string {
	data, err := os.ReadFile(path)
	if err != nil {
		return []string{fmt.Sprintf("%s: %v", path, err)}
	}
	var patterns []string
	for _, l := range strings.Split(string(data), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		patterns = append(patterns, l)
	}
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.Dir}}{{end}}", pkg).Output()
	if err != nil {
		return []string{fmt.Sprintf("go list -deps %s: %v", pkg, err)}
	}
	root, _ := os.Getwd()
	need := slices.Clone(contextFiles)
	need = append(need, "go.mod", "go.sum")
	for _, dir := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		rel, err := filepath.Rel(root, dir)
		if err != nil || strings.HasPrefix(rel, "..") {
			continue // module cache
		}
		need = append(need, filepath.ToSlash(rel)+"/x.go")
	}
	var problems []string
	for _, p := range need {
		if pat := ignoredBy(patterns, p); pat != "" {
			problems = append(problems, fmt.Sprintf("%s: pattern %q leaves %s out of the build context, but the image needs it", path, pat, strings.TrimSuffix(p, "/x.go")))
		}
	}
	return problems
}

// ignoredBy returns the .dockerignore pattern excluding rel (slash path), or
// "". It knows the forms the file uses: a path or directory prefix, globs
// within one path segment, and a leading **/.
func ignoredBy(patterns []string, rel string) string {
	excluded := ""
	for _, pat := range patterns {
		neg := strings.HasPrefix(pat, "!")
		p := strings.TrimSuffix(strings.TrimPrefix(pat, "!"), "/")
		matches := false
		segs := strings.Split(rel, "/")
		for i := 1; i <= len(segs) && !matches; i++ {
			prefix := strings.Join(segs[:i], "/")
			if strings.HasPrefix(p, "**/") {
				if ok, _ := filepath.Match(strings.TrimPrefix(p, "**/"), segs[i-1]); ok {
					matches = true
				}
			} else if ok, _ := filepath.Match(p, prefix); ok {
				matches = true
			}
		}
		if matches {
			if neg {
				excluded = ""
			} else {
				excluded = pat
			}
		}
	}
	return excluded
}
