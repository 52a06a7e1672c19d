package txhook

import (
	"database/sql"
	"path/filepath"
	"testing"

	_ "github.com/mattn/go-sqlite3"
)

// StmtContext re-prepares a statement by its text, which database/sql
// keeps unexported: a Go release that renames the field fails here, not
// in a user's PrepareStmt session.
func TestStmtQuery(t *testing.T) {
	db, err := sql.Open("sqlite3", filepath.Join(t.TempDir(), "t.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	const q = "SELECT ? + 1"
	stmt, err := db.Prepare(q)
	if err != nil {
		t.Fatal(err)
	}
	defer stmt.Close()
	if got := stmtQuery(stmt); got != q {
		t.Errorf("stmtQuery = %q, want %q", got, q)
	}
}
