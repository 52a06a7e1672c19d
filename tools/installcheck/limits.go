package main

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
)

// What a published module's zip may hold: every user of the module
// downloads all of it. Pictures belong in docs/images, a module of its own
// that is never published; a built binary or a data dump does not belong in
// the repository at all.
const (
	maxFile = 512 << 10 // uncompressed, per file
	maxZip  = 2 << 20   // compressed, the whole zip
)

var pictures = []string{".png", ".jpg", ".jpeg", ".gif", ".webp", ".avif", ".svg", ".ico", ".mp4", ".webm"}

// checkZip checks a module zip against the limits and returns its size.
func checkZip(zipPath string) (int64, error) {
	files, size, err := zipFiles(zipPath)
	if err != nil {
		return 0, err
	}
	var errs []error
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		rel := name[strings.Index(name, "/")+1:] // after "<path>@<version>/"
		if i := strings.Index(name, "@"); i >= 0 {
			if j := strings.Index(name[i:], "/"); j >= 0 {
				rel = name[i+j+1:]
			}
		}
		if n := files[name]; n > maxFile {
			errs = append(errs, fmt.Errorf("%s is %s, over the %s a file of a published module may be (a build output? git rm --cached it and ignore it)", rel, humanSize(n), humanSize(maxFile)))
		}
		if slices.Contains(pictures, strings.ToLower(path.Ext(rel))) {
			errs = append(errs, fmt.Errorf("%s is a picture: pictures go to docs/images (a module of its own, never published), linked from there", rel))
		}
	}
	if size > maxZip {
		errs = append(errs, fmt.Errorf("the zip is %s, over the %s every user would download", humanSize(size), humanSize(maxZip)))
	}
	return size, errors.Join(errs...)
}
