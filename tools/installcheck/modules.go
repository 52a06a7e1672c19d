package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/mod/modfile"
)

// unpublished are the directories (relative to the root, and what lies
// under them) whose modules are never tagged: the benchmark program, the
// repository's tools (this one), and the documentation's pictures (a
// module only so that the core's zip leaves them out). Every other go.mod
// is a published module.
var unpublished = []string{"bench", "tools", "docs/images"}

// published is one module of the repository that users install.
type published struct {
	rel   string // its directory, slash-separated, relative to the root ("" for the core)
	dir   string // that directory in the working tree
	path  string
	gomod []byte // go.mod as published
	mod   *modfile.File
	rev   string // the git revision its zip is made from; "" for the directory
}

// origin says where the module's files come from.
func (m published) origin() string {
	if m.rev == "" {
		return "from " + m.dir
	}
	return "from git " + m.rev
}

func isUnpublished(rel string) bool {
	for _, u := range unpublished {
		if rel == u || strings.HasPrefix(rel, u+"/") {
			return true
		}
	}
	return false
}

// skipDir: directories the go command never takes modules from.
func skipDir(rel string) bool {
	base := path.Base(rel)
	return rel != "" && (strings.HasPrefix(base, ".") || strings.HasPrefix(base, "_") || base == "testdata" || base == "vendor")
}

// findModules returns the published modules, the core first: from the
// working tree's directories when rev is "", else from git revision rev
// (their go.mod as it is there, their zips made from it).
func findModules(root, rev string) ([]published, error) {
	var rels []string
	if rev == "" {
		err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, p)
			rel = filepath.ToSlash(rel)
			if rel == "." {
				rel = ""
			}
			if d.IsDir() {
				if skipDir(rel) {
					return filepath.SkipDir
				}
				return nil
			}
			if d.Name() == "go.mod" {
				rels = append(rels, path.Dir(rel))
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	} else {
		out, err := git(root, "ls-tree", "-r", "--name-only", rev)
		if err != nil {
			return nil, err
		}
		for _, f := range strings.Split(strings.TrimSpace(out), "\n") {
			if path.Base(f) != "go.mod" {
				continue
			}
			dir := path.Dir(f)
			skip := false
			for d := dir; d != "."; d = path.Dir(d) {
				skip = skip || skipDir(d)
			}
			if !skip {
				rels = append(rels, dir)
			}
		}
	}
	var mods []published
	for _, rel := range rels {
		if rel == "." {
			rel = ""
		}
		if isUnpublished(rel) {
			continue
		}
		m := published{rel: rel, dir: filepath.Join(root, filepath.FromSlash(rel)), rev: rev}
		var err error
		if rev == "" {
			m.gomod, err = os.ReadFile(filepath.Join(m.dir, "go.mod"))
		} else {
			var s string
			s, err = git(root, "show", rev+":"+path.Join(rel, "go.mod"))
			m.gomod = []byte(s)
		}
		if err != nil {
			return nil, err
		}
		if err := m.parse(); err != nil {
			return nil, err
		}
		mods = append(mods, m)
	}
	slices.SortFunc(mods, func(a, b published) int { return strings.Compare(a.path, b.path) })
	if len(mods) == 0 || mods[0].path != corePath {
		return nil, fmt.Errorf("no %s module under %s", corePath, root)
	}
	for _, m := range mods {
		if want := path.Join(corePath, m.rel); m.path != want {
			return nil, fmt.Errorf("%s/go.mod declares module %s: a module in %s must be %s, or its tag would not publish it", m.dir, m.path, m.rel, want)
		}
	}
	return mods, nil
}

func (m *published) parse() error {
	f, err := modfile.Parse(path.Join(m.rel, "go.mod"), m.gomod, nil)
	if err != nil {
		return err
	}
	m.mod, m.path = f, f.Module.Mod.Path
	return nil
}

// git runs a git command in dir and returns its output.
func git(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}
