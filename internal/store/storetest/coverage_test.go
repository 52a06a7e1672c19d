package storetest

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeStore has the method set of the core and the Inbox and Walker
// roles (its methods are never called: uncalled reads its type alone).
type fakeStore struct {
	store.Store
	store.Inbox
	store.Walker
}

// allOf is a call count of every method of the roles given.
func allOf(roles ...reflect.Type) map[string]int {
	called := map[string]int{}
	for _, r := range roles {
		for i := range r.NumMethod() {
			called[r.Method(i).Name] = 1
		}
	}
	return called
}

// TestUncalled: the coverage check reports a method of a role the store
// implements that the suite never called, naming role and method, and
// nothing else. This is what makes the suite fail when a role's checks
// are removed (or a method is added to a role without a check).
func TestUncalled(t *testing.T) {
	var s fakeStore
	core, inbox, walker := reflect.TypeFor[store.Store](), reflect.TypeFor[store.Inbox](), reflect.TypeFor[store.Walker]()
	called := allOf(core, inbox, walker)
	assert.Empty(t, uncalled(s, called), "every method called")

	delete(called, "ForgetConsumed")
	assert.Equal(t, []string{"Inbox.ForgetConsumed"}, uncalled(s, called), "an Inbox method never called")

	// A section removed: none of the role's methods called.
	called = allOf(core, inbox)
	assert.ElementsMatch(t, []string{"Walker.Walk", "Walker.Defer", "Walker.LowOpen"}, uncalled(s, called), "the Walker section removed")

	// A method of the core never called.
	called = allOf(core, inbox, walker)
	delete(called, "DeleteSent")
	assert.Equal(t, []string{"Store.DeleteSent"}, uncalled(s, called))

	// Roles the store lacks are not demanded.
	called = allOf(core, inbox, walker)
	for _, m := range uncalled(s, called) {
		t.Errorf("demanded of a store that lacks its role: %s", m)
	}
	assert.Empty(t, uncalled(struct{ store.Store }{}, allOf(core)), "a store with the core alone")
	assert.Len(t, uncalled(struct{ store.Store }{}, nil), core.NumMethod(), "nothing called: every method of the core")
}

// kept is a reporter that keeps what it is told.
type kept struct {
	name         string
	errors, logs []string
}

func (r *kept) Helper()      {}
func (r *kept) Name() string { return r.name }
func (r *kept) Errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}
func (r *kept) Logf(format string, args ...any) {
	r.logs = append(r.logs, fmt.Sprintf(format, args...))
}

// TestCheckCoverageFails: checkCoverage fails the test it is given for
// each method never called, naming the store, the role and the method,
// and passes when every one was.
func TestCheckCoverageFails(t *testing.T) {
	s := fakeStore{Store: namedStore{}}
	c := &calls{}
	for m := range allOf(reflect.TypeFor[store.Store](), reflect.TypeFor[store.Inbox]()) {
		c.add(m)
	}
	// Named as deep as -run reaches (TestCheckCoverageFails at most), so
	// that the check is made.
	r := &kept{name: "TestStore/fake"}
	checkCoverage(r, s, c)
	require.Len(t, r.errors, 3, "the Walker methods were never called: %v", r.errors)
	for i, m := range []string{"Walker.Defer", "Walker.LowOpen", "Walker.Walk"} {
		assert.Contains(t, r.errors[i], "store fake", "the store is named")
		assert.Contains(t, r.errors[i], m, "the role and method are named")
	}

	for _, m := range []string{"Walk", "Defer", "LowOpen"} {
		c.add(m)
	}
	r = &kept{name: "TestStore/fake"}
	checkCoverage(r, s, c)
	assert.Empty(t, r.errors, "every method called")
}

// namedStore is a store whose Name is all that checkCoverage's message
// reads of it.
type namedStore struct{ store.Store }

func (namedStore) Name() string { return "fake" }

// TestRecorderCounts: each call through the recorder counts under the
// method's name, and reaches the real store.
func TestRecorderCounts(t *testing.T) {
	c := &calls{}
	r := &recorder{real: namedStore{}, calls: c}
	assert.Equal(t, "fake", r.Name())
	assert.Equal(t, "fake", r.Name())
	assert.Equal(t, map[string]int{"Name": 2}, c.snapshot())
	assert.PanicsWithValue(t, "storetest: storetest.namedStore implements no store.Walker, and a section called it without asking",
		func() { _, _ = r.Defer(t.Context(), nil, nil, now) }, "a role the real store lacks")
}

// TestRolesListed: every interface of package store that a store
// implements (all but the connection, DB, and what InboxLead returns,
// Lead) is in roles, which the recorder implements in full; so a role
// added to package store is demanded of the stores that implement it.
func TestRolesListed(t *testing.T) {
	files, err := filepath.Glob("../*.go")
	require.NoError(t, err)
	var declared []string
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(token.NewFileSet(), f, nil, 0)
		require.NoError(t, err)
		ast.Inspect(file, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok || !ts.Name.IsExported() {
				return true
			}
			if _, ok := ts.Type.(*ast.InterfaceType); ok {
				declared = append(declared, ts.Name.Name)
			}
			return true
		})
	}
	require.NotEmpty(t, declared)
	var listed []string
	for _, r := range roles {
		listed = append(listed, r.Name())
		assert.True(t, reflect.TypeFor[*recorder]().Implements(r), "the recorder implements %s", r)
	}
	for _, name := range declared {
		if name == "DB" || name == "Lead" {
			continue
		}
		assert.True(t, slices.Contains(listed, name), "store.%s is an interface of package store that roles (coverage.go) lacks: add it, and its methods to the recorder", name)
	}
}
