package outboxui_test

import (
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxui"
)

// A service mounts the dashboard behind its own authentication. Here the
// "authentication" is a header check; use the service's real one.
func ExampleHandler() {
	db, done := exampleDB()
	defer done()
	ob := outbox.Plugin(outbox.Config{Logger: slog.New(slog.DiscardHandler)})
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}
	if err := outbox.PublishAlone(db, outbox.Event{ID: "e1", Type: "order.created"}); err != nil {
		log.Fatal(err)
	}

	dashboard := outboxui.Handler(db, ob, outboxui.Options{
		AllowActions: true,  // replay and purge buttons
		ShowPayloads: false, // payloads may hold personal data
		Title:        "Outbox · orders",
	})
	mux := http.NewServeMux()
	mux.Handle("/ops/outbox/", requireOperator(http.StripPrefix("/ops/outbox", dashboard)))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/ops/outbox/events?status=pending", nil)
	req.Header.Set("X-Operator", "alice")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.Status)
	fmt.Println(strings.Contains(string(body), `<a href="event?id=e1">e1</a>`))
	// Output:
	// 200 OK
	// true
}

// exampleDB opens a SQLite database in a temporary directory; done closes
// it and removes the directory.
func exampleDB() (db *gorm.DB, done func()) {
	dir, err := os.MkdirTemp("", "outboxui-example")
	if err != nil {
		log.Fatal(err)
	}
	db, err = gorm.Open(sqlite.Open("file:"+filepath.Join(dir, "app.db")+outbox.SQLiteDSNOptions),
		&gorm.Config{Logger: logger.Discard})
	if err != nil {
		log.Fatal(err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		log.Fatal(err)
	}
	return db, func() {
		_ = sqlDB.Close()
		_ = os.RemoveAll(dir)
	}
}

func requireOperator(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Operator") == "" {
			http.Error(w, "forbidden", http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}
