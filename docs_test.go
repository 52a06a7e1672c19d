package outbox

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/encode"
	"github.com/gorm-outbox/outbox/internal/engine"
	"github.com/gorm-outbox/outbox/internal/overview"
	"github.com/gorm-outbox/outbox/internal/store"
	mysqlstore "github.com/gorm-outbox/outbox/internal/store/mysql"
	pgstore "github.com/gorm-outbox/outbox/internal/store/postgres"
	sqlitestore "github.com/gorm-outbox/outbox/internal/store/sqlite"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// documented are the defaults and limits the docs state, as the code
// defines them. A row of a docs table that names one of these settings
// must give this default, and its limits cell must hold limit; every
// setting here must have such a row somewhere in docs/.
var documented = map[string]struct {
	def   any // int, bool, time.Duration or string
	limit string
}{
	"RelayConfig.BatchSize":        {defaultBatchSize, strconv.Itoa(maxBatchSize)},
	"RelayConfig.Workers":          {defaultWorkers, strconv.Itoa(maxWorkers)},
	"RelayConfig.PollInterval":     {defaultPollInterval, minPollInterval.String()},
	"RelayConfig.MaxAttempts":      {defaultMaxAttempts, ""},
	"RelayConfig.Backoff":          {"DefaultBackoff", ""},
	"RelayConfig.Lease":            {defaultLease, minLease.String()},
	"RelayConfig.StatementTimeout": {defaultStatementTimeout, minStatementTimeout.String()},
	"RelayConfig.OrderByAggregate": {false, ""},
	"Config.RetainSent":            {defaultRetainSent, ""},
	"Config.Mode":                  {"Persistent", ""},
	"Config.Table":                 {DefaultTable, ""},
	"Config.Logger":                {"slog.Default()", ""},
	"Config.DisableAutoMigrate":    {false, ""},
	"Config.MaxPayloadBytes":       {fmt.Sprintf("%d MiB", encode.DefaultMaxPayload>>20), ""},
	"Config.DeliverAfterCommit":    {false, ""},
	"Config.DisableNotify":         {false, ""},
	"ListParams.Limit":             {defaultListLimit, strconv.Itoa(maxListLimit)},
	"RelayConfig.HandlerTimeout":   {"the lease budget", ""},
	"RelayConfig.WaitReplicas":     {0, ""},
	"RelayConfig.Name":             {"host:pid", ""},
	"RelayGroupConfig.MaxActive":   {defaultMaxActive, ""},
	"Config.InboxTable":            {DefaultInboxTable, ""},
	"Config.InboxRetention":        {defaultInboxRetention, ""},
	"OverviewParams.Window":        {overview.DefaultWindow, "RollupRetention"},
	"OverviewParams.Step":          {"Window/60", "1000 intervals"},
}

// docRow is a row of a docs table: | `Name` | `default` | limits | ... |
var docRow = regexp.MustCompile("^\\|\\s*`([A-Za-z]+\\.[A-Za-z]+)`\\s*\\|\\s*`([^`]*)`\\s*\\|([^|]*)\\|")

func docFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("docs", "*.md"))
	require.NoError(t, err)
	require.NotEmpty(t, files, "no docs/*.md")
	return append(files, "README.md")
}

// checkDefault reports how doc, the default a docs row states, differs
// from want, or "".
func checkDefault(want any, doc string) string {
	switch w := want.(type) {
	case time.Duration:
		d, err := time.ParseDuration(doc)
		if err != nil || d != w {
			return fmt.Sprintf("the code's default is %v", w)
		}
	case int:
		if n, err := strconv.Atoi(strings.ReplaceAll(doc, ",", "")); err != nil || n != w {
			return fmt.Sprintf("the code's default is %d", w)
		}
	default:
		if doc != fmt.Sprint(w) {
			return fmt.Sprintf("the code's default is %v", w)
		}
	}
	return ""
}

// TestDocsDefaults: the defaults and limits in the docs' tables are the
// code's, so that they cannot drift again.
func TestDocsDefaults(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for _, f := range docFiles(t) {
		text, err := os.ReadFile(f)
		require.NoError(t, err)
		for i, line := range strings.Split(string(text), "\n") {
			m := docRow.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			want, ok := documented[m[1]]
			if !ok {
				continue
			}
			seen[m[1]] = true
			if why := checkDefault(want.def, m[2]); why != "" {
				t.Errorf("%s:%d: %s is documented with default %q; %s", f, i+1, m[1], m[2], why)
			}
			if want.limit != "" && !strings.Contains(strings.ReplaceAll(m[3], ",", ""), want.limit) {
				t.Errorf("%s:%d: %s's limits cell %q does not state the code's limit %s", f, i+1, m[1], strings.TrimSpace(m[3]), want.limit)
			}
		}
	}
	for name := range documented {
		assert.True(t, seen[name], "no docs table row gives %s's default", name)
	}
}

// TestDocsBatchGrowth: the default claim's growth through a backlog is
// stated with the code's figures in RelayConfig's doc comment and in the
// settings table.
func TestDocsBatchGrowth(t *testing.T) {
	t.Parallel()
	for _, f := range []string{"relay.go", filepath.Join("docs", "relay.md")} {
		text, err := os.ReadFile(f)
		require.NoError(t, err)
		flat := strings.Join(strings.Fields(strings.ReplaceAll(string(text), "//", "")), " ")
		assert.Contains(t, flat, fmt.Sprintf("in under %v (and an eighth of the lease budget)", growQuick), f)
		assert.Contains(t, flat, fmt.Sprintf("up to %d", defaultMaxBatch), f)
		assert.Contains(t, flat, fmt.Sprintf("%d again", defaultBatchSize), f)
	}
}

// TestDocsNotifyPace: the NOTIFY's pace as relay.md and DisableNotify's
// doc give it is the notifier's.
func TestDocsNotifyPace(t *testing.T) {
	t.Parallel()
	assert.Equal(t, time.Millisecond, minNotifyGap)
	ms := func(d time.Duration) string { return fmt.Sprintf("%d ms", d.Milliseconds()) }
	for f, phrases := range map[string][]string{
		"plugin.go": {
			"at most one a millisecond over time",
			"one per " + ms(busyGap) + " above " + thousands(busyCommitRate) + " commits a second",
			"one per " + ms(maxNotifyGap) + " while",
		},
		filepath.Join("docs", "relay.md"): {
			"under one a millisecond",
			"more than " + thousands(busyCommitRate) + " times a second waits at least " + ms(busyGap) + " after each NOTIFY",
			"one every " + ms(maxNotifyGap) + " per pool",
		},
	} {
		text, err := os.ReadFile(f)
		require.NoError(t, err)
		flat := strings.Join(strings.Fields(strings.ReplaceAll(string(text), "//", "")), " ")
		for _, p := range phrases {
			assert.Contains(t, flat, p, f)
		}
	}
}

// thousands is n with a comma between thousands, as the docs write it.
func thousands(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// TestDocsDSNOptions: the SQLite settings the docs show are the
// constants', and the database page quotes both constants whole.
func TestDocsDSNOptions(t *testing.T) {
	t.Parallel()
	timeout := regexp.MustCompile(`busy_timeout[=(](\d+)`)
	want := timeout.FindStringSubmatch(SQLiteDSNOptions)[1]
	require.Equal(t, want, timeout.FindStringSubmatch(SQLitePureGoDSNOptions)[1])
	for _, f := range docFiles(t) {
		text, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, m := range timeout.FindAllStringSubmatch(string(text), -1) {
			assert.Equal(t, want, m[1], "%s: a busy_timeout other than SQLiteDSNOptions'", f)
		}
	}
	page, err := os.ReadFile(filepath.Join("docs", "databases.md"))
	require.NoError(t, err)
	assert.Contains(t, string(page), SQLiteDSNOptions)
	assert.Contains(t, string(page), SQLitePureGoDSNOptions)
}

// readmeBlocks returns README.md's Go code blocks in order.
func readmeBlocks(t *testing.T) []string {
	t.Helper()
	text, err := os.ReadFile("README.md")
	require.NoError(t, err)
	var blocks []string
	for i, part := range strings.Split(string(text), "```go\n") {
		if i > 0 {
			end := strings.Index(part, "```")
			require.GreaterOrEqual(t, end, 0, "README.md: a Go code block is not closed")
			blocks = append(blocks, part[:end])
		}
	}
	return blocks
}

// readmeVariant is README's program with the driver's import and the
// gorm.Open line replaced by those of the block that names driver, its DSN
// literal replaced by dsn.
func readmeVariant(t *testing.T, program, driver, dsn string) string {
	t.Helper()
	for _, b := range readmeBlocks(t) {
		lines := strings.Split(strings.TrimSpace(b), "\n")
		if len(lines) != 2 || !strings.Contains(lines[0], `"gorm.io/driver/`+driver+`"`) {
			continue
		}
		imp, open := strings.TrimSpace(lines[0]), strings.TrimSpace(lines[1])
		lit := regexp.MustCompile(`"[^"]*"`).FindAllString(open, -1)
		require.Len(t, lit, 1, "the %s gorm.Open line has one DSN literal", driver)
		open = strings.Replace(open, lit[0], strconv.Quote(dsn), 1)
		out := strings.Replace(program, `"gorm.io/driver/sqlite"`, imp, 1)
		re := regexp.MustCompile(`(?m)^(\s*)db, err := gorm\.Open\(sqlite\.Open\(.*$`)
		require.Regexp(t, re, out)
		return re.ReplaceAllString(out, "${1}"+open)
	}
	t.Fatalf("README has no two-line block for gorm.io/driver/%s", driver)
	return ""
}

// TestReadmeExample: README's program is examples/readme, and it runs as
// written on SQLite, and with README's two-line change on PostgreSQL and
// MySQL/MariaDB (when their DSNs are set).
func TestReadmeExample(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs a program (-short)")
	}
	blocks := readmeBlocks(t)
	require.NotEmpty(t, blocks)
	program := blocks[0]
	committed, err := os.ReadFile(filepath.Join("examples", "readme", "main.go"))
	require.NoError(t, err)
	require.Equal(t, string(committed), program, "README's program differs from examples/readme/main.go")

	run := func(t *testing.T, source string) {
		dir := t.TempDir()
		src := filepath.Join(dir, "main.go")
		require.NoError(t, os.WriteFile(src, []byte(source), 0o600))
		target, err := filepath.Abs(filepath.Join("examples", "readme", "main.go"))
		require.NoError(t, err)
		overlay, err := json.Marshal(map[string]any{"Replace": map[string]string{target: src}})
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "overlay.json"), overlay, 0o600))
		bin := filepath.Join(dir, "readme")
		build := exec.Command("go", "build", "-overlay", filepath.Join(dir, "overlay.json"), "-o", bin, "./examples/readme")
		out, err := build.CombinedOutput()
		require.NoError(t, err, "build:\n%s", out)
		prog := exec.Command(bin)
		prog.Dir = dir // app.db goes there
		out, err = prog.CombinedOutput()
		require.NoError(t, err, "run:\n%s", out)
		// PostgreSQL's jsonb spaces the payload it gives back. GORM's
		// default logger warns of a slow statement (a loaded machine) on
		// the same output: not the program's.
		assert.Regexp(t, `^delivered order.placed for order \d+: \{"ID": ?\d+, ?"Total": ?42\}\n$`, withoutSlowSQL(string(out)))
	}
	t.Run("sqlite", func(t *testing.T) { run(t, program) })
	for name, backend := range map[string]func(*testing.T) backend{"postgres": postgresBackend, "mysql": mysqlBackend} {
		t.Run(name, func(t *testing.T) {
			db := backend(t).open(t, &gorm.Config{Logger: logger.Discard}) // a schema or database of the test's own
			dsn, ok := dsns.Load(db)
			require.True(t, ok)
			run(t, readmeVariant(t, program, name, dsn.(string)))
		})
	}
}

// TestDocsFigures: the figures the docs state in prose, as the code
// defines them.
func TestDocsFigures(t *testing.T) {
	relay, err := os.ReadFile("docs/relay.md")
	require.NoError(t, err)
	assert.Equal(t, 55*time.Second, engine.Budget(defaultLease), "RelayConfig.HandlerTimeout's doc and relay.md say 55s at the default Lease")
	assert.Contains(t, string(relay), "`55s` at the default Lease")
	assert.Equal(t, 50*time.Millisecond, engine.FlushAfter, "relay.md: outcomes gathered for up to 50 ms")
	assert.Equal(t, 100*time.Millisecond, engine.WalkEvery, "relay.md: the watermark's walk every 100 ms")
	for _, s := range []store.Store{pgstore.New("t"), mysqlstore.New("t"), sqlitestore.New("t")} {
		assert.Equal(t, 1000, s.Limits().OutcomeRows, "relay.md: 1000 rows an outcome statement, %s", s.Name())
	}
	assert.Contains(t, string(relay), "gathered for up to 50 ms, 1000 rows a statement")
	assert.Equal(t, 7*24*time.Hour, defaultInboxRetention, "modes.md: 7 days")
}

// TestEveryEntryPointHasAnExample: every exported function and method of
// the package is shown by a runnable Example: one named for it, or one
// that calls it. The methods GORM calls itself (the plugin's Name and
// Initialize, the model hooks) are not entry points.
func TestEveryEntryPointHasAnExample(t *testing.T) {
	notEntryPoints := map[string]string{
		"Outbox.Name":           "gorm.Plugin: GORM calls it",
		"Outbox.Initialize":     "gorm.Plugin: db.Use calls it",
		"Recorder.BeforeSave":   "a GORM hook",
		"Recorder.BeforeDelete": "a GORM hook",
		"Row.AfterFind":         "a GORM hook",
		"Row.TableName":         "GORM's table name",
	}
	fset := token.NewFileSet()
	// The package's files, its tests and external tests alike: go/parser's
	// ParseDir is deprecated, and build tags do not matter here (every
	// store_*.go file is read either way).
	entries, err := os.ReadDir(".")
	require.NoError(t, err)
	files := map[string]*ast.File{}
	for _, de := range entries {
		if de.IsDir() || !strings.HasSuffix(de.Name(), ".go") {
			continue
		}
		f, err := parser.ParseFile(fset, de.Name(), nil, 0)
		require.NoError(t, err)
		files[de.Name()] = f
	}
	exported := map[string]string{} // "Type.Method" or "Func" -> the name called
	named := map[string]bool{}      // Example names, suffixes dropped
	called := map[string]bool{}     // functions and methods the Examples call
	for file, f := range files {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok {
				continue
			}
			if strings.HasSuffix(file, "_test.go") {
				if !strings.HasPrefix(fd.Name.Name, "Example") {
					continue
				}
				n := strings.TrimPrefix(fd.Name.Name, "Example")
				if i := strings.LastIndex(n, "_"); i > 0 && n[i+1] >= 'a' && n[i+1] <= 'z' {
					n = n[:i] // ExampleX_suffix
				}
				named[strings.Replace(n, "_", ".", 1)] = true
				ast.Inspect(fd.Body, func(n ast.Node) bool {
					if c, ok := n.(*ast.CallExpr); ok {
						if sel, ok := c.Fun.(*ast.SelectorExpr); ok {
							called[sel.Sel.Name] = true
						}
					}
					return true
				})
				continue
			}
			if !fd.Name.IsExported() {
				continue
			}
			key := fd.Name.Name
			if fd.Recv != nil {
				typ := fd.Recv.List[0].Type
				if s, ok := typ.(*ast.StarExpr); ok {
					typ = s.X
				}
				id, ok := typ.(*ast.Ident)
				if !ok || !id.IsExported() {
					continue
				}
				key = id.Name + "." + fd.Name.Name
			}
			exported[key] = fd.Name.Name
		}
	}
	require.NotEmpty(t, exported)
	for key, name := range exported {
		if _, skip := notEntryPoints[key]; skip || named[key] || called[name] {
			continue
		}
		t.Errorf("%s has no Example: add Example%s (example_*_test.go), or call it in one", key, strings.Replace(key, ".", "_", 1))
	}
}

// withoutSlowSQL is out without GORM's default logger's slow-statement
// warnings (a line naming the caller and "SLOW SQL", then the statement).
func withoutSlowSQL(out string) string {
	lines := strings.SplitAfter(out, "\n")
	kept := lines[:0]
	for i := 0; i < len(lines); i++ {
		if strings.Contains(lines[i], "SLOW SQL >= ") {
			i++ // and the statement's line
			continue
		}
		kept = append(kept, lines[i])
	}
	return strings.Join(kept, "")
}
