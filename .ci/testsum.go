//go:build ignore

// Testsum reads `go test -json` on its standard input and prints what
// `go test` prints without -v (a line per package, the output of what
// failed), then what go test does not show: every skipped test with its
// reason, grouped, and the slowest tests. It exits 1 when a test or a
// build failed.
//
//	go test -json work | go run .ci/testsum.go
//	OUTBOX_TEST_FULL=1 go test -race -timeout 30m -json work | go run .ci/testsum.go
//
// .ci/run pipes the full test run through it (with pipefail, so that go
// test's own status counts too).
package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"
)

type event struct {
	Action     string
	Package    string
	Test       string
	Output     string
	Elapsed    float64
	ImportPath string
}

type test struct {
	pkg, name string
	output    []string
	elapsed   float64
}

func main() {
	os.Exit(summarize(os.Stdin, os.Stdout))
}

func summarize(in io.Reader, out io.Writer) int {
	var (
		tests   = map[[2]string]*test{}
		pkgOut  = map[string][]string{}
		skipped []*test
		done    []*test
		failed  bool
	)
	get := func(e event) *test {
		k := [2]string{e.Package, e.Test}
		if tests[k] == nil {
			tests[k] = &test{pkg: e.Package, name: e.Test}
		}
		return tests[k]
	}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			fmt.Fprintf(out, "%s\n", line) // go test's own messages (a build error before -json took over)
			continue
		}
		switch {
		case e.Action == "build-output":
			fmt.Fprint(out, e.Output)
		case e.Action == "build-fail":
			failed = true
		case e.Test != "" && e.Action == "output":
			t := get(e)
			t.output = append(t.output, e.Output)
		case e.Test != "" && (e.Action == "pass" || e.Action == "fail" || e.Action == "skip"):
			t := get(e)
			t.elapsed = e.Elapsed
			switch e.Action {
			case "fail":
				failed = true
				for _, l := range t.output {
					if !strings.HasPrefix(l, "=== ") { // RUN, PAUSE, CONT: what -v adds
						fmt.Fprint(out, l)
					}
				}
			case "skip":
				skipped = append(skipped, t)
			}
			done = append(done, t)
			if e.Action != "skip" {
				t.output = nil
			}
		case e.Test == "" && e.Action == "output":
			pkgOut[e.Package] = append(pkgOut[e.Package], e.Output)
		case e.Test == "" && (e.Action == "pass" || e.Action == "fail" || e.Action == "skip"):
			lines := pkgOut[e.Package]
			delete(pkgOut, e.Package)
			if e.Action == "fail" {
				failed = true
				for _, l := range lines {
					if !strings.HasPrefix(l, "=== ") {
						fmt.Fprint(out, l)
					}
				}
				continue
			}
			// What go test prints without -v: the last line; and what a
			// TestMain says after the run (a line "<name>: ...").
			for _, l := range lines {
				if strings.HasPrefix(l, "ok ") || strings.HasPrefix(l, "?") || strings.HasPrefix(l, "PASS") || strings.HasPrefix(l, "FAIL") ||
					strings.HasPrefix(l, "testing: warning") || strings.HasPrefix(l, "=== ") || strings.HasPrefix(l, "coverage:") {
					if strings.HasPrefix(l, "ok ") || strings.HasPrefix(l, "?") {
						fmt.Fprint(out, l)
					}
					continue
				}
				fmt.Fprint(out, "    "+l)
			}
		}
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintf(out, "testsum: reading go test -json: %v\n", err)
		failed = true
	}

	printSkips(out, skipped)
	printSlowest(out, done)
	if failed {
		fmt.Fprintln(out, "FAIL")
		return 1
	}
	return 0
}

var location = regexp.MustCompile(`^\s+\S+\.go:\d+: `)

// reason is the last line a skipped test logged with its file and line
// before its "--- SKIP": the first line of its t.Skip message.
func reason(t *test) string {
	r := "(no reason given)"
	for _, l := range t.output {
		if strings.Contains(l, "--- SKIP") {
			break
		}
		if location.MatchString(l) {
			r = strings.TrimSpace(location.ReplaceAllString(l, ""))
		}
	}
	return r
}

func printSkips(out io.Writer, skipped []*test) {
	type group struct {
		pkg, reason string
		tests       []string
	}
	var groups []*group
	index := map[[2]string]*group{}
	for _, t := range skipped {
		r := reason(t)
		if strings.HasPrefix(r, "helper process of ") {
			continue // a child process's entry point, skipped by design
		}
		k := [2]string{t.pkg, r}
		if index[k] == nil {
			index[k] = &group{pkg: t.pkg, reason: r}
			groups = append(groups, index[k])
		}
		index[k].tests = append(index[k].tests, t.name)
	}
	if len(groups) == 0 {
		fmt.Fprintln(out, "\nskipped: none")
		return
	}
	slices.SortFunc(groups, func(a, b *group) int { return cmp.Or(cmp.Compare(a.pkg, b.pkg), cmp.Compare(a.reason, b.reason)) })
	n := 0
	for _, g := range groups {
		n += len(g.tests)
	}
	fmt.Fprintf(out, "\nskipped: %d tests (go test -v shows each)\n", n)
	for _, g := range groups {
		names := g.tests
		if len(names) > 4 {
			names = append(slices.Clone(names[:4]), fmt.Sprintf("and %d more", len(g.tests)-4))
		}
		fmt.Fprintf(out, "  %s: %d: %s\n      %s\n", short(g.pkg), len(g.tests), g.reason, strings.Join(names, ", "))
	}
}

// printSlowest prints the ten slowest tests and subtests (a parent whose
// subtests run in parallel reports no time of its own).
func printSlowest(out io.Writer, done []*test) {
	top := slices.Clone(done)
	slices.SortFunc(top, func(a, b *test) int { return cmp.Compare(b.elapsed, a.elapsed) })
	if len(top) > 10 {
		top = top[:10]
	}
	if len(top) == 0 {
		return
	}
	fmt.Fprintln(out, "\nslowest tests:")
	for _, t := range top {
		fmt.Fprintf(out, "  %8v  %s %s\n", time.Duration(t.elapsed*float64(time.Second)).Round(100*time.Millisecond), short(t.pkg), t.name)
	}
}

// short is a package path relative to the repository's root ("." for the core).
func short(pkg string) string {
	if rel := strings.TrimPrefix(pkg, "github.com/gorm-outbox/outbox"); rel != pkg {
		return "." + rel
	}
	return pkg
}
