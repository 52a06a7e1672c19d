// Command installcheck proves that the repository's modules install the
// way a user's `go get` installs them, before they are published, and that
// a release's tags publish what they should.
//
//	cd tools/installcheck
//	go run . -root ../.. [-version v0.2.0] [-fix]   # the working tree's directories
//	go run . -root ../.. -ref HEAD                  # what a git revision holds
//	go run . -root ../.. -tags -version v0.3.0      # what the release's tags would publish
//	go run . -root ../.. -rehearse                  # a clone of HEAD, tagged as RELEASING.md says, checked as -tags
//	go run . -root ../.. -plan -version v0.3.0      # print the release's commands (RELEASING.md)
//
// It builds a throwaway module proxy (one zip per published module, made
// by golang.org/x/mod/zip as the Go command's own proxy protocol expects:
// from the directories, from a git revision with -ref, or each module from
// its own tag with -tags, as the Go module proxy makes them), then:
//
//  1. with -tags: checks the tag set (tags.go): every published module has
//     its tag (<dir>/<version>; the core: <version>), every requirement of
//     one module of the repository on another is at the version being
//     released, and the required module's tag is at the same commit or an
//     earlier one (a module is tagged after what it requires);
//  2. checks every zip (limits.go): no file over 512 KiB, no pictures, no
//     zip over 2 MiB: what every user downloads stays small;
//  3. checks that every published module requires the core at the version
//     being released, with no replace directive, and that `go mod tidy`
//     against the throwaway proxy changes nothing in its go.mod or go.sum
//     (but the go.sum lines of the repository's modules, whose hashes are
//     the throwaway proxy's);
//  4. in an empty module outside the repository, with GOWORK=off and
//     GOFLAGS=-mod=mod, runs `go get` of the core and every adapter at that
//     version, builds a small program using all of them, and runs it
//     against the PostgreSQL named by OUTBOX_TEST_POSTGRES_DSN: an event
//     published in a transaction is delivered through the webhook adapter
//     to a local HTTP server, its signature verified;
//  5. installs the outbox command with `go install .../cmd/outbox@version`
//     and checks that `outbox version` reports that version.
//
// The modules it does not publish are listed in unpublished (modules.go);
// every other go.mod in the repository is a published module.
//
// It exits non-zero, saying why, on any failure.
package main

import (
	"archive/zip"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	modzip "golang.org/x/mod/zip"
)

const corePath = "github.com/gorm-outbox/outbox"

// fix: checkTidy writes the tidied files back instead of failing.
var fix bool

func main() {
	root := flag.String("root", "../..", "the repository's root")
	version := flag.String("version", "", "the version to publish (default: the one the modules require)")
	keep := flag.Bool("keep", false, "keep the temporary proxy and consumer module")
	ref := flag.String("ref", "", "zip the modules from this git revision instead of the working tree's directories")
	tags := flag.Bool("tags", false, "zip each module from its release tag (<dir>/<version>; the core: <version>), checking the tag set first")
	rehearse := flag.Bool("rehearse", false, "clone the repository's HEAD, tag it as RELEASING.md says and check it as -tags does")
	plan := flag.Bool("plan", false, "print the release's commands for -version (bump, tag, check, push) and exit")
	flag.BoolVar(&fix, "fix", false, "write what go mod tidy against the published modules gives back into each module's go.mod and go.sum (after a change of the core's dependencies), instead of failing")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("installcheck: ")
	var err error
	switch {
	case *plan:
		err = printPlan(os.Stdout, *root, *version)
	case *rehearse:
		err = rehearseRelease(*root, *version, *keep)
	default:
		src := fromDir
		if *ref != "" {
			src = fromRef
		}
		if *tags {
			if *ref != "" {
				err = errors.New("-ref and -tags exclude each other")
				break
			}
			src = fromTags
		}
		err = run(*root, *version, src, *ref, *keep)
	}
	if err != nil {
		log.Fatal(err)
	}
	if !*plan {
		log.Print("ok")
	}
}

// zipSource is where the published modules' files come from.
type zipSource int

const (
	fromDir  zipSource = iota // the working tree's directories
	fromRef                   // one git revision
	fromTags                  // each module's own release tag
)

func run(root, version string, src zipSource, ref string, keep bool) error {
	root, err := filepath.Abs(root)
	if err != nil {
		return err
	}
	var mods []published
	switch src {
	case fromDir:
		mods, err = findModules(root, "")
	case fromRef:
		mods, err = findModules(root, ref)
	case fromTags:
		// The modules the repository has now must all be tagged.
		mods, err = findModules(root, "HEAD")
	}
	if err != nil {
		return err
	}
	if version == "" {
		if src == fromTags {
			return errors.New("-tags needs -version")
		}
		version, err = requiredCore(mods)
		if err != nil {
			return err
		}
	}
	if !semver.IsValid(version) || semver.Canonical(version) != version {
		return fmt.Errorf("version %q is not a canonical semantic version (v1.2.3)", version)
	}
	if src == fromTags {
		if mods, err = checkTags(root, version, mods); err != nil {
			return err
		}
		log.Printf("the tags of %d modules at %s are in place and in order", len(mods), version)
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
	var zips []string
	for _, m := range mods {
		if err := checkRequires(m, version); err != nil {
			return err
		}
		zf, err := addToProxy(proxy, root, m, version)
		if err != nil {
			return fmt.Errorf("%s: %w", m.path, err)
		}
		zips = append(zips, zf)
	}
	var limits []error
	for i, m := range mods {
		size, err := checkZip(zips[i])
		if err != nil {
			limits = append(limits, fmt.Errorf("%s: %w", m.path, err))
		}
		log.Printf("%s@%s: %s (%s)", m.path, version, humanSize(size), m.origin())
	}
	if err := errors.Join(limits...); err != nil {
		return err
	}
	log.Printf("proxy of %d modules at %s in %s", len(mods), version, proxy)
	env := goEnv(proxy, tmp)
	for i, m := range mods {
		if m.path == corePath {
			continue // its go.mod is checked by the repository's own CI
		}
		if err := checkTidy(env, tmp, m, version, zips[i]); err != nil {
			return fmt.Errorf("%s: %w", m.path, err)
		}
	}
	return consumer(env, tmp, mods, version)
}

// requiredCore is the core version the modules require; they must agree.
func requiredCore(mods []published) (string, error) {
	var v string
	for _, m := range mods {
		for _, r := range m.mod.Require {
			if r.Mod.Path != corePath {
				continue
			}
			if v != "" && r.Mod.Version != v {
				return "", fmt.Errorf("%s requires %s %s, another module %s", m.path, corePath, r.Mod.Version, v)
			}
			v = r.Mod.Version
		}
	}
	if v == "" {
		return "", errors.New("no module requires the core; pass -version")
	}
	return v, nil
}

// checkRequires: no replace directive, and every requirement on a module
// of the repository at the version being released (they are released
// together).
func checkRequires(m published, version string) error {
	for _, r := range m.mod.Replace {
		return fmt.Errorf("%s/go.mod replaces %s: a user's go get would ignore it (use go.work for local builds)", m.dir, r.Old.Path)
	}
	if m.path == corePath {
		return nil
	}
	core := false
	for _, r := range m.mod.Require {
		if !inRepo(r.Mod.Path) {
			continue
		}
		if r.Mod.Version != version {
			return fmt.Errorf("%s requires %s %s, not the version being released, %s", m.path, r.Mod.Path, r.Mod.Version, version)
		}
		core = core || r.Mod.Path == corePath
	}
	if !core {
		return fmt.Errorf("%s does not require %s", m.path, corePath)
	}
	return nil
}

// inRepo: the module path is the core's or one nested in it.
func inRepo(path string) bool { return path == corePath || strings.HasPrefix(path, corePath+"/") }

// addToProxy writes the module's files in the GOPROXY layout,
// <path>/@v/{list,<v>.info,<v>.mod,<v>.zip}, and returns the zip's path.
func addToProxy(proxy, root string, m published, version string) (string, error) {
	esc, err := module.EscapePath(m.path)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(proxy, esc, "@v")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	mv := module.Version{Path: m.path, Version: version}
	zipPath := filepath.Join(dir, version+".zip")
	zf, err := os.Create(zipPath)
	if err != nil {
		return "", err
	}
	if m.rev == "" {
		err = modzip.CreateFromDir(zf, mv, m.dir)
	} else {
		err = modzip.CreateFromVCS(zf, mv, root, m.rev, m.rel)
	}
	if err != nil {
		zf.Close()
		return "", fmt.Errorf("zip: %w", err)
	}
	if err := zf.Close(); err != nil {
		return "", err
	}
	info, _ := json.Marshal(map[string]any{"Version": version, "Time": time.Now().UTC().Format(time.RFC3339)})
	for name, data := range map[string][]byte{
		"list":            []byte(version + "\n"),
		version + ".info": info,
		version + ".mod":  m.gomod,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return "", err
		}
	}
	return zipPath, nil
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
	// -trimpath: the same code built from another directory (this run's
	// own module cache) still hits the shared build cache.
	shared := strings.TrimSpace(output(exec.Command("go", "env", "GOMODCACHE")))
	return append(env,
		"GOWORK=off",
		"GOFLAGS=-mod=mod -modcacherw -trimpath",
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

// checkTidy unzips the module as published and runs go mod tidy on it
// against the proxy: go.mod must not change, nor go.sum but for the lines
// of the repository's modules.
func checkTidy(env []string, tmp string, m published, version, zipPath string) error {
	cp := filepath.Join(tmp, "tidy", strings.ReplaceAll(m.path, "/", "_"))
	if err := modzip.Unzip(cp, module.Version{Path: m.path, Version: version}, zipPath); err != nil {
		return err
	}
	want := map[string][]byte{}
	for _, name := range []string{"go.mod", "go.sum"} {
		want[name], _ = os.ReadFile(filepath.Join(cp, name))
	}
	if err := gocmd(env, cp, "mod", "tidy"); err != nil {
		return err
	}
	for _, name := range []string{"go.mod", "go.sum"} {
		w := want[name]
		got, _ := os.ReadFile(filepath.Join(cp, name))
		if name == "go.sum" {
			w, got = withoutRepo(w), withoutRepo(got)
		}
		if bytes.Equal(w, got) {
			continue
		}
		if fix && m.rev == "" {
			// The repository's go.sum lines are left out: their hash is the
			// throwaway proxy's.
			if err := os.WriteFile(filepath.Join(m.dir, name), got, 0o644); err != nil {
				return err
			}
			log.Printf("fixed %s/%s", m.dir, name)
			continue
		}
		return fmt.Errorf("go mod tidy against the published modules changes %s/%s:\n%s", m.dir, name, got)
	}
	return nil
}

// withoutRepo drops the go.sum lines of the core and the other modules of
// the repository: their hash is the throwaway proxy's, known only once the
// version is published.
func withoutRepo(sum []byte) []byte {
	var b bytes.Buffer
	for _, line := range strings.SplitAfter(string(sum), "\n") {
		if !strings.HasPrefix(line, corePath+" ") && !strings.HasPrefix(line, corePath+"/") {
			b.WriteString(line)
		}
	}
	return b.Bytes()
}

// zipFiles lists a zip's files and their uncompressed sizes.
func zipFiles(path string) (map[string]int64, int64, error) {
	r, err := zip.OpenReader(path)
	if err != nil {
		return nil, 0, err
	}
	defer r.Close()
	files := map[string]int64{}
	for _, f := range r.File {
		files[f.Name] = int64(f.UncompressedSize64)
	}
	st, err := os.Stat(path)
	if err != nil {
		return nil, 0, err
	}
	return files, st.Size(), nil
}

func humanSize(n int64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}
