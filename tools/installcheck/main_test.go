package main

import (
	"archive/zip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const repoRoot = "../.."

// TestReleaseOrder: the repository's published modules, in the order they
// are tagged, each after what it requires; RELEASING.md lists the same
// tags in the same order.
func TestReleaseOrder(t *testing.T) {
	mods, err := findModules(repoRoot, "")
	if err != nil {
		t.Fatal(err)
	}
	tags, err := planTags(mods, "vX.Y.Z")
	if err != nil {
		t.Fatal(err)
	}
	if tags[0] != "vX.Y.Z" {
		t.Errorf("the core is not tagged first: %v", tags)
	}
	pos := map[string]int{}
	for i, m := range mods {
		pos[m.path] = slices.Index(tags, tagFor(m.rel, "vX.Y.Z"))
		if pos[m.path] < 0 {
			t.Fatalf("%s has no tag in %v", m.path, tags)
		}
		_ = i
	}
	for _, m := range mods {
		for _, r := range m.mod.Require {
			if p, ok := pos[r.Mod.Path]; ok && p > pos[m.path] {
				t.Errorf("%s is tagged before %s, which it requires", m.path, r.Mod.Path)
			}
		}
		if isUnpublished(m.rel) {
			t.Errorf("%s is listed as unpublished", m.rel)
		}
	}

	page, err := os.ReadFile(filepath.Join(repoRoot, "RELEASING.md"))
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, m := range regexp.MustCompile(`(?m)^git tag -a (\S+) -m \S+$`).FindAllStringSubmatch(string(page), -1) {
		listed = append(listed, m[1])
	}
	if !slices.Equal(listed, tags) {
		t.Errorf("RELEASING.md tags\n  %s\nthe modules need (installcheck -plan)\n  %s", strings.Join(listed, "\n  "), strings.Join(tags, "\n  "))
	}
}

// TestEveryModuleClassified: each go.mod of the repository is a published
// module or listed in unpublished; go.work uses every module but
// docs/images.
func TestEveryModuleClassified(t *testing.T) {
	out, err := git(repoRoot, "ls-files", "*go.mod")
	if err != nil {
		t.Skip("not a git checkout:", err)
	}
	mods, err := findModules(repoRoot, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range strings.Fields(out) {
		rel := strings.TrimSuffix(strings.TrimSuffix(f, "go.mod"), "/")
		if !isUnpublished(rel) && !slices.ContainsFunc(mods, func(m published) bool { return m.rel == rel }) {
			t.Errorf("%s is neither published nor listed in unpublished", f)
		}
	}
}

// repo is a throwaway git repository holding a core and nested modules.
type repo struct {
	t   *testing.T
	dir string
}

func newRepo(t *testing.T, mods map[string]string) *repo {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git")
	}
	r := &repo{t, t.TempDir()}
	r.git("init", "-q")
	for rel, requires := range mods {
		path := corePath
		if rel != "" {
			path += "/" + rel
		}
		gomod := "module " + path + "\n\ngo 1.26\n"
		if requires != "" {
			gomod += "\nrequire (\n"
			for _, req := range strings.Split(requires, ",") {
				gomod += "\t" + strings.Replace(req, "@", " ", 1) + "\n"
			}
			gomod += ")\n"
		}
		r.write(filepath.Join(rel, "go.mod"), gomod)
		r.write(filepath.Join(rel, "x.go"), "package x\n")
	}
	r.write("LICENSE", "MIT\n")
	r.commit("one")
	return r
}

func (r *repo) write(name, data string) {
	r.t.Helper()
	p := filepath.Join(r.dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		r.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		r.t.Fatal(err)
	}
}

func (r *repo) git(args ...string) string {
	r.t.Helper()
	out, err := git(r.dir, append([]string{"-c", "user.name=t", "-c", "user.email=t@localhost"}, args...)...)
	if err != nil {
		r.t.Fatal(err)
	}
	return out
}

func (r *repo) commit(msg string) {
	r.git("add", "-A")
	r.git("commit", "-q", "-m", msg)
}

func (r *repo) tags(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestCheckTags: what the tag check accepts and what it refuses, each
// refusal naming what to do.
func TestCheckTags(t *testing.T) {
	layout := map[string]string{
		"":                "",
		"adapters/nats":   corePath + "@v1.0.0",
		"outboxui":        corePath + "@v1.0.0",
		"cmd/outbox":      corePath + "@v1.0.0," + corePath + "/outboxui@v1.0.0",
		"bench":           corePath + "@v0.0.0", // unpublished: never tagged
		"docs/images":     "",
		"internal/x/.hid": "", // a dot directory: not a module the go command sees
	}
	check := func(r *repo) error {
		mods, err := findModules(r.dir, "HEAD")
		if err != nil {
			t.Fatal(err)
		}
		if len(mods) != 4 {
			t.Fatalf("found %d published modules, want 4: %v", len(mods), mods)
		}
		_, err = checkTags(r.dir, "v1.0.0", mods)
		return err
	}
	all := []string{"v1.0.0", "adapters/nats/v1.0.0", "outboxui/v1.0.0", "cmd/outbox/v1.0.0"}

	t.Run("all tagged at one commit", func(t *testing.T) {
		r := newRepo(t, layout)
		for _, tag := range all {
			r.git("tag", tag)
		}
		if err := check(r); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("a tag missing", func(t *testing.T) {
		r := newRepo(t, layout)
		for _, tag := range all {
			if tag != "outboxui/v1.0.0" {
				r.git("tag", tag)
			}
		}
		err := check(r)
		if !strings.Contains(r.tags(err), "no tag outboxui/v1.0.0") {
			t.Fatalf("want the missing tag named, got %v", err)
		}
	})
	t.Run("a module tagged before what it requires", func(t *testing.T) {
		r := newRepo(t, layout)
		r.git("tag", "v1.0.0")
		r.git("tag", "adapters/nats/v1.0.0")
		r.git("tag", "cmd/outbox/v1.0.0")
		r.write("outboxui/y.go", "package x\n")
		r.commit("two")
		r.git("tag", "outboxui/v1.0.0") // after the command that requires it
		err := check(r)
		if !strings.Contains(r.tags(err), "tag outboxui/v1.0.0 is at a commit that tag cmd/outbox/v1.0.0") {
			t.Fatalf("want the order refused, got %v", err)
		}
	})
	t.Run("a requirement not bumped", func(t *testing.T) {
		l := map[string]string{"": "", "adapters/nats": corePath + "@v0.9.0"}
		r := newRepo(t, l)
		r.git("tag", "v1.0.0")
		r.git("tag", "adapters/nats/v1.0.0")
		mods, err := findModules(r.dir, "HEAD")
		if err != nil {
			t.Fatal(err)
		}
		_, err = checkTags(r.dir, "v1.0.0", mods)
		if !strings.Contains(r.tags(err), "requires "+corePath+" v0.9.0, not v1.0.0") {
			t.Fatalf("want the stale requirement refused, got %v", err)
		}
	})
	t.Run("release order", func(t *testing.T) {
		r := newRepo(t, layout)
		mods, err := findModules(r.dir, "HEAD")
		if err != nil {
			t.Fatal(err)
		}
		got, err := planTags(mods, "v1.0.0")
		if err != nil {
			t.Fatal(err)
		}
		want := []string{"v1.0.0", "adapters/nats/v1.0.0", "outboxui/v1.0.0", "cmd/outbox/v1.0.0"}
		if !slices.Equal(got, want) {
			t.Fatalf("order %v, want %v", got, want)
		}
	})
}

// TestCheckZip: a picture or a big file in a published module is refused.
func TestCheckZip(t *testing.T) {
	mk := func(files map[string]int) string {
		p := filepath.Join(t.TempDir(), "m.zip")
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		w := zip.NewWriter(f)
		for name, n := range files {
			fw, err := w.CreateHeader(&zip.FileHeader{Name: corePath + "/outboxui@v1.0.0/" + name, Method: zip.Store})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := fw.Write(make([]byte, n)); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		f.Close()
		return p
	}
	if _, err := checkZip(mk(map[string]int{"go.mod": 100, "ui.go": 200 << 10})); err != nil {
		t.Errorf("a small module refused: %v", err)
	}
	_, err := checkZip(mk(map[string]int{"go.mod": 100, "screenshots/list.png": 10 << 10}))
	if err == nil || !strings.Contains(err.Error(), "screenshots/list.png is a picture") {
		t.Errorf("a picture accepted: %v", err)
	}
	_, err = checkZip(mk(map[string]int{"go.mod": 100, "outbox": 3 << 20}))
	if err == nil || !strings.Contains(err.Error(), "outbox is 3.0 MiB") || !strings.Contains(err.Error(), "the zip is") {
		t.Errorf("a big file accepted: %v", err)
	}
}

// TestMarkdownLinks: every relative link or picture in the repository's
// Markdown files points at a file that exists (the screenshots moved to
// docs/images/outboxui).
func TestMarkdownLinks(t *testing.T) {
	out, err := git(repoRoot, "ls-files", "--cached", "--others", "--exclude-standard", "*.md")
	if err != nil {
		t.Skip("not a git checkout:", err)
	}
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	for _, md := range strings.Fields(out) {
		data, err := os.ReadFile(filepath.Join(repoRoot, md))
		if err != nil {
			continue // deleted in the working tree
		}
		inCode := false
		for i, line := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "```") {
				inCode = !inCode
			}
			if inCode {
				continue
			}
			for _, m := range link.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "#") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				target, _, _ = strings.Cut(target, "#")
				p := filepath.Join(repoRoot, filepath.Dir(md), filepath.FromSlash(target))
				if _, err := os.Stat(p); err != nil {
					t.Errorf("%s:%d: link to %s, which does not exist", md, i+1, m[1])
				}
			}
		}
	}
}
