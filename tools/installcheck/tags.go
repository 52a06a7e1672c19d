package main

import (
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/mod/semver"
)

// tagFor is the tag that publishes the module in directory rel at version:
// the version itself for the core, prefixed by the directory for a nested
// module (adapters/nats/v0.3.0), as the go command looks them up.
func tagFor(rel, version string) string {
	if rel == "" {
		return version
	}
	return rel + "/" + version
}

// releaseOrder sorts the modules so that each comes after every module of
// the repository it requires (the core first), and otherwise by path.
func releaseOrder(mods []published) ([]published, error) {
	byPath := map[string]published{}
	for _, m := range mods {
		byPath[m.path] = m
	}
	var order []published
	done := map[string]bool{}
	for len(order) < len(mods) {
		progress := false
		for _, m := range mods { // sorted by path
			if done[m.path] {
				continue
			}
			ready := true
			for _, r := range m.mod.Require {
				if _, ours := byPath[r.Mod.Path]; ours && r.Mod.Path != m.path && !done[r.Mod.Path] {
					ready = false
				}
			}
			if ready {
				order = append(order, m)
				done[m.path] = true
				progress = true
				break // the earliest path among the ready ones
			}
		}
		if !progress {
			return nil, errors.New("the modules of the repository require each other in a cycle")
		}
	}
	return order, nil
}

// checkTags checks the release's tag set in the repository at root: every
// published module has its tag; each tag's go.mod requires the modules of
// the repository at version, and each required module's tag is at the
// same commit or an earlier one (a module is never tagged before what it
// requires). It returns the modules as the tags publish them (go.mod read
// at the tag, zipped from it).
func checkTags(root, version string, mods []published) ([]published, error) {
	var errs []error
	commit := map[string]string{}
	for _, m := range mods {
		tag := tagFor(m.rel, version)
		c, err := git(root, "rev-parse", "-q", "--verify", "refs/tags/"+tag+"^{commit}")
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: no tag %s (git tag -a %s -m %s)", m.path, tag, tag, tag))
			continue
		}
		commit[m.path] = strings.TrimSpace(c)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	byPath := map[string]published{}
	for _, m := range mods {
		byPath[m.path] = m
	}
	var out []published
	for _, m := range mods {
		tag := tagFor(m.rel, version)
		gomod, err := git(root, "show", commit[m.path]+":"+path.Join(m.rel, "go.mod"))
		if err != nil {
			errs = append(errs, fmt.Errorf("tag %s: %w", tag, err))
			continue
		}
		t := m
		t.rev, t.gomod = tag, []byte(gomod)
		if err := t.parse(); err != nil {
			errs = append(errs, fmt.Errorf("tag %s: %w", tag, err))
			continue
		}
		if t.path != m.path {
			errs = append(errs, fmt.Errorf("tag %s: %s/go.mod declares %s, not %s", tag, m.rel, t.path, m.path))
			continue
		}
		for _, r := range t.mod.Require {
			dep, ours := byPath[r.Mod.Path]
			if !ours {
				if inRepo(r.Mod.Path) {
					errs = append(errs, fmt.Errorf("tag %s: %s requires %s, which is no published module of the repository", tag, t.path, r.Mod.Path))
				}
				continue
			}
			if r.Mod.Version != version {
				errs = append(errs, fmt.Errorf("tag %s: %s requires %s %s, not %s: bump the requirement (installcheck -plan) before tagging", tag, t.path, r.Mod.Path, r.Mod.Version, version))
				continue
			}
			depTag := tagFor(dep.rel, version)
			if c, d := commit[m.path], commit[dep.path]; c != d {
				if _, err := git(root, "merge-base", "--is-ancestor", d, c); err != nil {
					errs = append(errs, fmt.Errorf("tag %s is at a commit that tag %s (at %.12s) does not contain, yet %s requires %s %s: tag a module at the commit of what it requires, or after it", depTag, tag, c, t.path, dep.path, version))
				}
			}
		}
		out = append(out, t)
	}
	return out, errors.Join(errs...)
}

// printPlan prints the release's commands for version, from the
// repository's modules as they are: bump the requirements between them
// (and go.work's replaces), tag in order, check, push in order.
func printPlan(w io.Writer, root, version string) error {
	if !semver.IsValid(version) || semver.Canonical(version) != version {
		return fmt.Errorf("-plan needs -version, a canonical semantic version (v1.2.3); got %q", version)
	}
	root, err := filepath.Abs(root)
	if err != nil {
		return err
	}
	mods, err := findModules(root, "")
	if err != nil {
		return err
	}
	order, err := releaseOrder(mods)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "# The release of %s: run from the repository's root (RELEASING.md).\n\n", version)
	fmt.Fprintf(w, "# 1. The modules require each other at %s (and go.work stands in for those versions).\n", version)
	work, err := os.ReadFile(filepath.Join(root, "go.work"))
	if err != nil {
		return err
	}
	for _, m := range order {
		var args []string
		for _, r := range m.mod.Require {
			if inRepo(r.Mod.Path) && r.Mod.Version != version {
				args = append(args, "-require="+r.Mod.Path+"@"+version)
			}
		}
		if len(args) > 0 {
			fmt.Fprintf(w, "(cd %s && go mod edit %s)\n", m.rel, strings.Join(args, " "))
		}
	}
	var drop, add []string
	for _, line := range strings.Split(string(work), "\n") {
		f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), "replace "))
		if len(f) == 4 && f[2] == "=>" && inRepo(f[0]) && f[1] != version {
			drop = append(drop, "-dropreplace="+f[0]+"@"+f[1])
			add = append(add, "-replace="+f[0]+"@"+version+"="+f[3])
		}
	}
	if len(drop) > 0 {
		fmt.Fprintf(w, "go work edit %s \\\n  %s\n", strings.Join(drop, " "), strings.Join(add, " "))
	}
	fmt.Fprintf(w, "grep -rln --include='*.md' '@v[0-9]' . | grep -v CHANGELOG   # the docs' go get / go install lines: make them @%s\n", version)
	fmt.Fprintf(w, "\n# 2. Commit that, then tag the commit: each module after the modules it requires.\n")
	for _, m := range order {
		t := tagFor(m.rel, version)
		fmt.Fprintf(w, "git tag -a %s -m %s\n", t, t)
	}
	fmt.Fprintf(w, "\n# 3. Check what the tags would publish, before pushing them.\n")
	fmt.Fprintf(w, "(cd tools/installcheck && go run . -root ../.. -tags -version %s)\n", version)
	fmt.Fprintf(w, "\n# 4. Push the commit, then the tags in the same order.\n")
	fmt.Fprintf(w, "git push origin HEAD\n")
	for _, m := range order {
		fmt.Fprintf(w, "git push origin %s\n", tagFor(m.rel, version))
	}
	fmt.Fprintf(w, "\n# 5. Have the Go module proxy fetch them now, in the same order.\n")
	for _, m := range order {
		fmt.Fprintf(w, "(cd /tmp && GOWORK=off GOPROXY=https://proxy.golang.org go list -m %s@%s)\n", m.path, version)
	}
	return nil
}

// rehearseRelease clones the repository's HEAD, tags it as printPlan
// says, in that order, and checks the clone's tags with run. The version is
// the one the modules require now (their requirements are already bumped
// on the commit being released).
func rehearseRelease(root, version string, keep bool) error {
	root, err := filepath.Abs(root)
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "installcheck-rehearse")
	if err != nil {
		return err
	}
	if keep {
		log.Printf("keeping %s", tmp)
	} else {
		defer os.RemoveAll(tmp)
	}
	clone := filepath.Join(tmp, "repo")
	if _, err := git(tmp, "clone", "-q", "--no-hardlinks", root, clone); err != nil {
		return err
	}
	mods, err := findModules(clone, "HEAD")
	if err != nil {
		return err
	}
	if version == "" {
		if version, err = requiredCore(mods); err != nil {
			return err
		}
	}
	order, err := releaseOrder(mods)
	if err != nil {
		return err
	}
	var tags []string
	for _, m := range order {
		t := tagFor(m.rel, version)
		if _, err := git(clone, "-c", "user.name=installcheck", "-c", "user.email=installcheck@localhost", "tag", "-a", t, "-m", t); err != nil {
			return err
		}
		tags = append(tags, t)
	}
	log.Printf("rehearsal: a clone of %s's HEAD, tagged %s", root, strings.Join(tags, ", "))
	return run(clone, version, fromTags, "", keep)
}

// planTags is the tag order printPlan prints, for tests and RELEASING.md.
func planTags(mods []published, version string) ([]string, error) {
	order, err := releaseOrder(mods)
	if err != nil {
		return nil, err
	}
	return slices.Collect(func(yield func(string) bool) {
		for _, m := range order {
			if !yield(tagFor(m.rel, version)) {
				return
			}
		}
	}), nil
}
