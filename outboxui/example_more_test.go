package outboxui_test

import (
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxui"
)

// The zero Options give a read-only dashboard that hides payloads: a safe
// default for a page many people can open. Passing a nil outbox uses the
// one installed on db. Pages are served; replay and purge are refused.
func ExampleHandler_readOnly() {
	db, done := exampleDB()
	defer done()
	quiet := slog.New(slog.DiscardHandler)
	if err := db.Use(outbox.Plugin(outbox.Config{Logger: quiet})); err != nil {
		log.Fatal(err)
	}

	mux := http.NewServeMux()
	mux.Handle("/outbox/", outboxui.Handler(db, nil, outboxui.Options{Logger: quiet}))

	for _, req := range []*http.Request{
		httptest.NewRequest(http.MethodGet, "/outbox/", nil),
		httptest.NewRequest(http.MethodPost, "/outbox/replay", strings.NewReader("id=e1&confirm=yes")),
	} {
		if req.Method == http.MethodPost {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		body, _ := io.ReadAll(rec.Body)
		fmt.Println(req.Method, req.URL.Path, rec.Code, "says read-only:", strings.Contains(string(body), "read-only"))
	}
	// Output:
	// GET /outbox/ 200 says read-only: true
	// POST /outbox/replay 403 says read-only: true
}
