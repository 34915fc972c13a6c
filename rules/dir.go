package rules

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
)

// MaxRuleFileBytes bounds what is read of one rule, guard or test file. A
// rule file is a page or two of YAML; anything this large is a mistake (or
// a link to something that is not a rule file), refused before parsing.
const MaxRuleFileBytes = 1 << 20

// ResolveDir is a directory as the confinement checks compare it: absolute,
// with every symlink resolved. `rtproxy run`, `check` and `test` all resolve
// the rules directory (and tables_dir) through it, so a relative path and an
// absolute one are the same directory.
func ResolveDir(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	return filepath.EvalSymlinks(abs)
}

// resolvePath is a file path resolved as ResolveDir resolves directories.
func resolvePath(p string) (string, error) {
	return ResolveDir(p)
}

// within reports whether the resolved path real is the resolved directory
// dir or inside it.
func within(dir, real string) bool {
	if dir == "" || real == "" {
		return false
	}
	rel, err := filepath.Rel(dir, real)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) && !filepath.IsAbs(rel)
}

// FileRefusedError is a rule, guard or test file that is not read: it
// resolves outside its directory, is not a regular file, or is too large.
// Its message names the file and where it leads, never what it holds.
type FileRefusedError struct {
	Path string // as given
	Msg  string
}

func (e *FileRefusedError) Error() string { return e.Msg }

// ReadConfined reads the file at path, which must resolve (symlinks
// followed) to a regular file of at most max bytes inside the directory
// dir; dir is resolved with ResolveDir first, and an empty dir means the
// file's own directory. A symlink to another file of the directory (a
// Kubernetes ConfigMap's `name -> ..data/name`, `..data -> ..2026_...`)
// is read; one that leads out of it (/proc/self/environ, /etc/shadow), to a
// device, FIFO or directory, or a file over max is refused with a
// *FileRefusedError that never carries the file's content. Opening does not
// block on a FIFO swapped in after the check.
func ReadConfined(dir, path string, max int64) ([]byte, error) {
	if dir == "" {
		dir = filepath.Dir(path)
	}
	rdir, err := ResolveDir(dir)
	if err != nil {
		return nil, err
	}
	real, err := resolvePath(path)
	if err != nil {
		return nil, err
	}
	if !within(rdir, real) {
		return nil, &FileRefusedError{Path: path, Msg: fmt.Sprintf("%s resolves to %s, outside the directory %s; a rule, guard or test file must be a file of its directory (a symlink to another file inside it is fine), so it was not read", path, real, rdir)}
	}
	f, err := os.OpenFile(real, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, &FileRefusedError{Path: path, Msg: fmt.Sprintf("%s is not a regular file (%s), so it was not read", path, fi.Mode().Type())}
	}
	if fi.Size() > max {
		return nil, &FileRefusedError{Path: path, Msg: fmt.Sprintf("%s is %d bytes, more than the %d a rule, guard or test file may have, so it was not read", path, fi.Size(), max)}
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, &FileRefusedError{Path: path, Msg: fmt.Sprintf("%s is more than the %d bytes a rule, guard or test file may have, so it was not read", path, max)}
	}
	return b, nil
}

// readRuleFile reads a rule file confined to dir (empty: its own
// directory), as every loader does.
func readRuleFile(dir, path string) ([]byte, error) {
	return ReadConfined(dir, path, MaxRuleFileBytes)
}

// isRuleFileName reports whether a directory entry is a rule file: *.yaml
// or *.yml, not hidden, and not a test file (*.test.yaml). Hidden names include a Kubernetes ConfigMap
// mount's `..data` and `..2026_01_01_...` directories, whose files are the
// same files again behind the visible symlinks.
func isRuleFileName(name string) bool {
	if strings.HasPrefix(name, ".") {
		return false
	}
	lower := strings.ToLower(name)
	if strings.HasSuffix(lower, ".test.yaml") || strings.HasSuffix(lower, ".test.yml") {
		return false // a test file of `rtproxy test`, not a route
	}
	ext := filepath.Ext(lower)
	return ext == ".yaml" || ext == ".yml"
}

// ruleFiles lists the rule files of dir, sorted, following symlinks and
// skipping anything that is not a regular file (subdirectories are not
// searched).
func ruleFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if !isRuleFileName(e.Name()) {
			continue
		}
		p := filepath.Join(dir, e.Name())
		fi, err := os.Stat(p) // follows symlinks
		if err != nil || !fi.Mode().IsRegular() {
			continue
		}
		out = append(out, p)
	}
	sort.Strings(out)
	return out, nil
}

// fileResult is the load of one rule file.
type fileResult struct {
	path    string
	content []byte
	res     *loadResult
}

func loadPath(dir, path string, o Options) *fileResult {
	fr := &fileResult{path: path}
	src, err := readRuleFile(dir, path)
	if err != nil {
		fr.res = &loadResult{errs: ErrorList{readError(path, err)}}
		return fr
	}
	fr.content = src
	fr.res = loadBytes(path, src, o)
	return fr
}

// readError is the refusal of a rule file that could not be read.
func readError(path string, err error) *Error {
	var re *FileRefusedError
	if errors.As(err, &re) {
		return &Error{File: path, Msg: "rule file refused: " + re.Msg}
	}
	return &Error{File: path, Msg: fmt.Sprintf("cannot read rule file: %v", unwrapPathError(err))}
}

// checkNames refuses a route or guard name that an earlier file in results
// already uses (routes and guards share one namespace), and a view name
// another view uses (views have their own: a view's name is a topic
// name, which a route or guard may share). The refused file's route is
// dropped; the error names both files. results are in priority order: the
// first file with a name keeps it.
// With onlyValid, a file that is refused anyway claims no name, so a valid
// file still runs (loading); without it every conflict is reported now
// (checking), since it will bite once the other file is fixed.
func checkNames(results []*fileResult, onlyValid bool) {
	type first struct {
		file  string
		pos   position
		guard bool
	}
	seen := map[string]first{}
	for _, fr := range results {
		name := fr.res.name
		if name == "" || (onlyValid && len(fr.res.errs) > 0) {
			continue
		}
		key := claimKey(name, fr.res.view)
		if f, dup := seen[key]; dup {
			msg := nameTaken(name, fr.res.guard, f.guard, fmt.Sprintf("%s:%d:%d", f.file, f.pos.line, f.pos.col))
			if fr.res.view {
				msg = viewNameTaken(name, fmt.Sprintf("%s:%d:%d", f.file, f.pos.line, f.pos.col))
			}
			fr.res.errs = append(fr.res.errs, &Error{
				File: fr.path, Line: fr.res.nameNode.line, Col: fr.res.nameNode.col, Text: name, Msg: msg,
			})
			fr.res.route = nil
			continue
		}
		seen[key] = first{fr.path, fr.res.nameNode, fr.res.guard}
	}
}

// claimKey is the namespace entry a name claims: views have their own.
func claimKey(name string, view bool) string {
	if view {
		return "view\x00" + name
	}
	return name
}

// viewNameTaken refuses a view name another view (at "file:line:col")
// already uses.
func viewNameTaken(name, at string) string {
	return fmt.Sprintf("view name `%s` is already used by the view at %s; clients fetch a view by its name, so view names must be unique in the rules directory (one in-place view per topic: list all its clients in it). Rename one of them", name, at)
}

// nameTaken refuses a name that the file at `at` ("file:line:col")
// already uses. Routes and guards share one namespace; between two routes
// the message is the one it always was.
func nameTaken(name string, guard, firstGuard bool, at string) string {
	if !guard && !firstGuard {
		return fmt.Sprintf("route name `%s` is already used by %s; route names must be unique in the rules directory, rename one of them", name, at)
	}
	return fmt.Sprintf("%s name `%s` is already used by the %s at %s; route and guard names must be unique in the rules directory, rename one of them",
		fileKind(guard), name, fileKind(firstGuard), at)
}

func fileKind(guard bool) string {
	if guard {
		return "guard"
	}
	return "route"
}

// LoadDir loads every rule file of dir (*.yaml and *.yml, not hidden, not
// in subdirectories, symlinks followed) and checks names across files. It
// returns the valid routes, guard files among them (Route.Guard set), and
// every error; a file with errors yields no route. Each error is an *Error.
func LoadDir(dir string) ([]*Route, []error) {
	return LoadDirWith(dir, Options{})
}

// LoadDirWith is LoadDir with o.
func LoadDirWith(dir string, o Options) ([]*Route, []error) {
	files, err := ruleFiles(dir)
	if err != nil {
		return nil, []error{&Error{File: dir, Msg: fmt.Sprintf("cannot read rules directory: %v", unwrapPathError(err))}}
	}
	results := make([]*fileResult, len(files))
	for i, f := range files {
		results[i] = loadPath(dir, f, o)
	}
	checkNames(results, true)
	checkGraph(results) // graph.go
	var routes []*Route
	var errs []error
	for _, fr := range results {
		if len(fr.res.errs) > 0 {
			fr.res.errs.sort()
			for _, e := range fr.res.errs {
				errs = append(errs, e)
			}
			continue
		}
		routes = append(routes, fr.res.route)
	}
	return routes, errs
}

// CheckPaths is `rtproxy check PATH...`: it loads every file named and
// every rule file of every directory named, checks route names across all
// of them, and prints "ok <file>" for each good file ("ok <file> (guard
// NAME: topic TOPIC, N checks)" for a guard file) and each error on its
// own line. It returns false when anything is wrong; the caller exits 1.
func CheckPaths(w io.Writer, paths []string) bool {
	return CheckPathsWith(w, paths, Options{})
}

// CheckPathsWith is CheckPaths with o.
func CheckPathsWith(w io.Writer, paths []string, o Options) bool {
	ok := true
	var results []*fileResult
	seen := map[string]bool{}
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			var pe *os.PathError
			if errors.As(err, &pe) {
				err = pe.Err
			}
			fmt.Fprintf(w, "%s: %v\n", p, err)
			ok = false
			continue
		}
		var files []string
		dir := filepath.Dir(p) // a file named alone: its own directory
		if fi.IsDir() {
			dir = p
			files, err = ruleFiles(p)
			if err != nil {
				fmt.Fprintf(w, "%s: cannot read directory: %v\n", p, unwrapPathError(err))
				ok = false
				continue
			}
			if len(files) == 0 {
				fmt.Fprintf(w, "%s: no rule files (*.yaml, *.yml) in this directory\n", p)
				ok = false
				continue
			}
		} else {
			files = []string{p}
		}
		for _, f := range files {
			key := f
			if abs, err := filepath.Abs(f); err == nil {
				key = abs
			}
			if seen[key] {
				continue
			}
			seen[key] = true
			results = append(results, loadPath(dir, f, o))
		}
	}
	checkNames(results, false)
	checkGraph(results) // graph.go
	for _, fr := range results {
		if len(fr.res.errs) == 0 {
			if g := fr.res.route.Guard; g != nil {
				checks := "checks"
				if len(g.Checks) == 1 {
					checks = "check"
				}
				fmt.Fprintf(w, "ok %s (guard %s: topic %s, %d %s)\n", fr.path, fr.res.route.Name, g.Topic, len(g.Checks), checks)
			} else if v := fr.res.route.View; v != nil {
				fmt.Fprintf(w, "ok %s (view %s: %s)\n", fr.path, fr.res.route.Name, fr.res.route.ViewSummary())
			} else {
				fmt.Fprintf(w, "ok %s\n", fr.path)
			}
			for _, e := range fr.res.warns {
				fmt.Fprintf(w, "warning: %s\n", e.Error())
			}
			continue
		}
		ok = false
		fr.res.errs.sort()
		for _, e := range fr.res.errs {
			fmt.Fprintln(w, e.Error())
		}
	}
	return ok
}

// tableFileAllowed refuses a table file that is not a regular file inside
// the rules directory dir or tablesDir (symlinks resolved): a rule file must
// not be able to read any file the proxy can (/proc/self/environ, a
// secret), and a FIFO or device would hang the reload that opens it. Both
// directories and the file are resolved the same way (ResolveDir), so a
// relative rules directory (`rtproxy check rules/`, `--tables-dir .`) is the
// same directory as its absolute form.
func tableFileAllowed(dir, tablesDir, p string) error {
	real, err := resolvePath(p)
	if err != nil {
		return nil // does not exist (yet): LoadFileTable says so
	}
	inside := func(d string) bool {
		if d == "" {
			return false
		}
		rd, err := ResolveDir(d)
		return err == nil && within(rd, real)
	}
	if !inside(dir) && !inside(tablesDir) {
		where := "the rules directory"
		if tablesDir != "" {
			where += " or tables_dir (" + tablesDir + ")"
		} else {
			where += " (or a directory named by the proxy's tables_dir)"
		}
		return fmt.Errorf("the table file %s is outside %s; table files must be inside it", real, where)
	}
	fi, err := os.Stat(real)
	if err != nil {
		return nil
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("the table file %s is not a regular file (%s)", real, fi.Mode().Type())
	}
	return nil
}
