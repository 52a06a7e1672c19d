// Command installcheck proves that the repository's modules install the
// way a user's `go get` installs them, before they are published.
//
//	cd tools/installcheck && go run . -root ../.. [-version v0.2.0] [-fix]
//
// It builds a throwaway module proxy from the working tree (one zip per
// published module, made by golang.org/x/mod/zip as the Go command's own
// proxy protocol expects), then:
//
//  1. checks that every published module requires the core at the version
//     being released, with no replace directive, and that `go mod tidy`
//     against the throwaway proxy changes nothing in its go.mod or go.sum
//     (but the core's own go.sum lines, whose hash is the working tree's);
//  2. in an empty module outside the repository, with GOWORK=off and
//     GOFLAGS=-mod=mod, runs `go get` of the core and every adapter at that
//     version, builds a small program using all of them, and runs it
//     against the PostgreSQL named by OUTBOX_TEST_POSTGRES_DSN: an event
//     published in a transaction is delivered through the webhook adapter
//     to a local HTTP server, its signature verified;
//  3. installs the outbox command with `go install .../cmd/outbox@version`
//     and checks that `outbox version` reports that version.
//
// It exits non-zero, saying why, on any failure.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	modzip "golang.org/x/mod/zip"
)

const corePath = "github.com/gorm-outbox/outbox"

// fix: checkTidy writes the tidied files back instead of failing.
var fix bool

func main() {
	root := flag.String("root", "../..", "the repository's root")
	version := flag.String("version", "", "the version to publish (default: the one the adapters require)")
	keep := flag.Bool("keep", false, "keep the temporary proxy and consumer module")
	flag.BoolVar(&fix, "fix", false, "write what go mod tidy against the published modules gives back into each module's go.mod and go.sum (after a change of the core's dependencies), instead of failing")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("installcheck: ")
	if err := run(*root, *version, *keep); err != nil {
		log.Fatal(err)
	}
	log.Print("ok")
}

// published is one module of the repository that users install.
type published struct {
	dir  string
	path string
	mod  *modfile.File
}

func run(root, version string, keep bool) error {
	root, err := filepath.Abs(root)
	if err != nil {
		return err
	}
	mods, err := findModules(root)
	if err != nil {
		return err
	}
	if version == "" {
		version, err = requiredCore(mods)
		if err != nil {
			return err
		}
	}
	if !strings.HasPrefix(version, "v") {
		return fmt.Errorf("version %q must start with v", version)
	}
	tmp, err := os.MkdirTemp("", "installcheck")
	if err != nil {
		return err
	}
	if keep {
		log.Printf("keeping %s", tmp)
	} else {
		defer os.RemoveAll(tmp)
	}
	proxy := filepath.Join(tmp, "proxy")
	for _, m := range mods {
		if err := checkRequires(m, version); err != nil {
			return err
		}
		if err := addToProxy(proxy, m, version); err != nil {
			return fmt.Errorf("%s: %w", m.path, err)
		}
	}
	log.Printf("proxy of %d modules at %s in %s", len(mods), version, proxy)
	env := goEnv(proxy, tmp)
	for _, m := range mods {
		if m.path == corePath {
			continue // its go.mod is checked by the repository's own CI
		}
		if err := checkTidy(env, tmp, m); err != nil {
			return fmt.Errorf("%s: %w", m.path, err)
		}
	}
	return consumer(env, tmp, mods, version)
}

// findModules returns the core and the adapters: every go.mod under root
// but the repository's own tooling and benchmark.
func findModules(root string) ([]published, error) {
	var mods []published
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			rel, _ := filepath.Rel(root, p)
			if rel == "tools" || rel == "bench" || strings.HasPrefix(d.Name(), ".") && rel != "." || d.Name() == "testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		if d.Name() != "go.mod" {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		f, err := modfile.Parse(p, data, nil)
		if err != nil {
			return err
		}
		mods = append(mods, published{dir: filepath.Dir(p), path: f.Module.Mod.Path, mod: f})
		return nil
	})
	slices.SortFunc(mods, func(a, b published) int { return strings.Compare(a.path, b.path) })
	if len(mods) == 0 || mods[0].path != corePath {
		return nil, fmt.Errorf("no %s module under %s", corePath, root)
	}
	return mods, err
}

// requiredCore is the core version the adapters require; they must agree.
func requiredCore(mods []published) (string, error) {
	var v string
	for _, m := range mods {
		for _, r := range m.mod.Require {
			if r.Mod.Path != corePath {
				continue
			}
			if v != "" && r.Mod.Version != v {
				return "", fmt.Errorf("%s requires %s %s, another adapter %s", m.path, corePath, r.Mod.Version, v)
			}
			v = r.Mod.Version
		}
	}
	if v == "" {
		return "", errors.New("no adapter requires the core; pass -version")
	}
	return v, nil
}

func checkRequires(m published, version string) error {
	for _, r := range m.mod.Replace {
		return fmt.Errorf("%s/go.mod replaces %s: a user's go get would ignore it (use go.work for local builds)", m.dir, r.Old.Path)
	}
	if m.path == corePath {
		return nil
	}
	for _, r := range m.mod.Require {
		if r.Mod.Path == corePath {
			if r.Mod.Version != version {
				return fmt.Errorf("%s requires %s %s, not the version being released, %s", m.path, corePath, r.Mod.Version, version)
			}
			return nil
		}
	}
	return fmt.Errorf("%s does not require %s", m.path, corePath)
}

// addToProxy writes the module's files in the GOPROXY layout:
// <path>/@v/{list,<v>.info,<v>.mod,<v>.zip}.
func addToProxy(proxy string, m published, version string) error {
	esc, err := module.EscapePath(m.path)
	if err != nil {
		return err
	}
	dir := filepath.Join(proxy, esc, "@v")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	mv := module.Version{Path: m.path, Version: version}
	zf, err := os.Create(filepath.Join(dir, version+".zip"))
	if err != nil {
		return err
	}
	if err := modzip.CreateFromDir(zf, mv, m.dir); err != nil {
		zf.Close()
		return fmt.Errorf("zip: %w", err)
	}
	if err := zf.Close(); err != nil {
		return err
	}
	gomod, err := os.ReadFile(filepath.Join(m.dir, "go.mod"))
	if err != nil {
		return err
	}
	info, _ := json.Marshal(map[string]any{"Version": version, "Time": time.Now().UTC().Format(time.RFC3339)})
	for name, data := range map[string][]byte{
		"list":            []byte(version + "\n"),
		version + ".info": info,
		version + ".mod":  gomod,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// goEnv is the environment of a user's go command, with the throwaway
// proxy in front of the real one and this repository's modules outside
// the checksum database (they are not published).
func goEnv(proxy, tmp string) []string {
	upstream := strings.TrimSpace(output(exec.Command("go", "env", "GOPROXY")))
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		for _, k := range []string{"GOWORK=", "GOFLAGS=", "GOPROXY=", "GONOSUMDB=", "GONOSUMCHECK=", "GOPRIVATE=", "GONOPROXY="} {
			if strings.HasPrefix(kv, k) {
				return true
			}
		}
		return false
	})
	// A module cache of its own: a shared one may hold an earlier build of
	// this same unpublished version, which would shadow the proxy. The
	// shared cache's downloads still serve the third-party modules.
	shared := strings.TrimSpace(output(exec.Command("go", "env", "GOMODCACHE")))
	return append(env,
		"GOWORK=off",
		"GOFLAGS=-mod=mod -modcacherw",
		"GOMODCACHE="+filepath.Join(tmp, "modcache"),
		"GOPROXY=file://"+filepath.ToSlash(proxy)+",file://"+filepath.ToSlash(filepath.Join(shared, "cache", "download"))+","+upstream,
		"GONOSUMDB="+corePath,
		"GOTOOLCHAIN=local",
	)
}

func output(cmd *exec.Cmd) string {
	out, _ := cmd.Output()
	return string(out)
}

func gocmd(env []string, dir string, args ...string) error {
	cmd := exec.Command("go", args...)
	cmd.Dir, cmd.Env = dir, env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go %s in %s: %w\n%s", strings.Join(args, " "), dir, err, out.String())
	}
	return nil
}

// checkTidy copies the module and runs go mod tidy on the copy against the
// proxy: go.mod must not change, nor go.sum but for the core's lines.
func checkTidy(env []string, tmp string, m published) error {
	cp := filepath.Join(tmp, "tidy", filepath.Base(m.dir))
	if err := os.CopyFS(cp, os.DirFS(m.dir)); err != nil {
		return err
	}
	if err := gocmd(env, cp, "mod", "tidy"); err != nil {
		return err
	}
	for _, name := range []string{"go.mod", "go.sum"} {
		want, _ := os.ReadFile(filepath.Join(m.dir, name))
		got, _ := os.ReadFile(filepath.Join(cp, name))
		if name == "go.sum" {
			want, got = withoutCore(want), withoutCore(got)
		}
		if !bytes.Equal(want, got) {
			if fix {
				// The core's go.sum lines are left out: their hash is the
				// throwaway proxy's.
				if err := os.WriteFile(filepath.Join(m.dir, name), got, 0o644); err != nil {
					return err
				}
				log.Printf("fixed %s/%s", m.dir, name)
				continue
			}
			return fmt.Errorf("go mod tidy against the published modules changes %s/%s:\n%s", m.dir, name, got)
		}
	}
	return nil
}

// withoutCore drops the go.sum lines of the core and the other modules of
// the repository: their hash is the working tree's, known only once the
// version is published.
func withoutCore(sum []byte) []byte {
	var b bytes.Buffer
	for _, line := range strings.SplitAfter(string(sum), "\n") {
		// The core and every module of the repository (the command
		// requires the dashboard): their hashes are the throwaway proxy's.
		if !strings.HasPrefix(line, corePath+" ") && !strings.HasPrefix(line, corePath+"/") {
			b.WriteString(line)
		}
	}
	return b.Bytes()
}

const consumerMain = `package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/adapters/kafka"
	"github.com/gorm-outbox/outbox/adapters/nats"
	"github.com/gorm-outbox/outbox/adapters/rabbitmq"
	"github.com/gorm-outbox/outbox/adapters/redis"
	"github.com/gorm-outbox/outbox/adapters/webhook"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// Every adapter is linked in; the webhook one delivers for real.
var _ = []any{kafka.New, nats.New, rabbitmq.New, redis.New}

func main() {
	db, err := gorm.Open(postgres.Open(os.Getenv("OUTBOX_TEST_POSTGRES_DSN")), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		log.Fatal(err)
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	table := "installcheck_" + hex.EncodeToString(b)
	defer db.Exec("DROP TABLE IF EXISTS " + table)
	ob := outbox.Plugin(outbox.Config{Table: table})
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}
	secret := []byte("installcheck")
	got := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := webhook.Verify(secret, r.Header, body, time.Minute); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		got <- string(body)
	}))
	defer srv.Close()
	sender, err := webhook.New(srv.URL, secret, webhook.Config{})
	if err != nil {
		log.Fatal(err)
	}
	ob.Handle("installed", sender.Handler())
	if err := db.Transaction(func(tx *gorm.DB) error {
		return outbox.Publish(tx, outbox.Event{ID: "e1", Type: "installed", Payload: map[string]string{"hello": "world"}})
	}); err != nil {
		log.Fatal(err)
	}
	relay, err := ob.Relay(db, outbox.RelayConfig{})
	if err != nil {
		log.Fatalf("relay: %v", err)
	}
	n, err := relay.ProcessOnce(context.Background())
	if err != nil || n != 1 {
		log.Fatalf("relay: %d events, %v", n, err)
	}
	select {
	case body := <-got:
		fmt.Println("delivered:", body)
	case <-time.After(10 * time.Second):
		log.Fatal("nothing delivered")
	}
}
`

// consumer installs the modules into an empty module, builds a program on
// them and runs it.
func consumer(env []string, tmp string, mods []published, version string) error {
	if os.Getenv("OUTBOX_TEST_POSTGRES_DSN") == "" {
		return errors.New("OUTBOX_TEST_POSTGRES_DSN is not set: the installed program needs PostgreSQL")
	}
	dir := filepath.Join(tmp, "consumer")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	goVersion := strings.TrimPrefix(strings.TrimSpace(output(exec.Command("go", "env", "GOVERSION"))), "go")
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module example.com/consumer\n\ngo "+goVersion+"\n"), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(consumerMain), 0o644); err != nil {
		return err
	}
	get := []string{"get"}
	for _, m := range mods {
		get = append(get, m.path+"@"+version)
	}
	get = append(get, "gorm.io/driver/postgres@v1.6.3")
	for _, args := range [][]string{get, {"mod", "tidy"}, {"build", "-o", "consumer", "."}} {
		if err := gocmd(env, dir, args...); err != nil {
			return err
		}
	}
	log.Printf("installed %d modules at %s with go get", len(mods), version)
	cmd := exec.Command(filepath.Join(dir, "consumer"))
	cmd.Env = os.Environ()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("the installed program failed: %w\n%s", err, out)
	}
	log.Printf("the installed program ran: %s", strings.TrimSpace(string(out)))
	return installCommand(env, tmp, dir, mods, version)
}

// installCommand installs the outbox command as its README says, go
// install .../cmd/outbox@version, and runs its version subcommand, which
// must report the version installed.
func installCommand(env []string, tmp, dir string, mods []published, version string) error {
	const cmdPath = corePath + "/cmd/outbox"
	if !slices.ContainsFunc(mods, func(m published) bool { return m.path == cmdPath }) {
		return nil
	}
	bin := filepath.Join(tmp, "bin")
	if err := gocmd(append(env, "GOBIN="+bin), dir, "install", cmdPath+"@"+version); err != nil {
		return err
	}
	out, err := exec.Command(filepath.Join(bin, "outbox"), "version").CombinedOutput()
	if err != nil {
		return fmt.Errorf("the installed outbox command failed: %w\n%s", err, out)
	}
	if want := "outbox " + version + " (core " + version + ","; !strings.HasPrefix(string(out), want) {
		return fmt.Errorf("outbox version printed %q, want it to start with %q", out, want)
	}
	log.Printf("go install %s@%s: %s", cmdPath, version, strings.TrimSpace(string(out)))
	return nil
}
