package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/gorm-outbox/outbox/outboxui"
)

// ui serves the dashboard until ctx ends (Ctrl-C, SIGTERM).
func (c *cli) ui(ctx context.Context, args []string) error {
	fs := c.flags("ui", "[--listen ADDR] [--allow-actions] [--show-payloads] [--max-pending-age D]")
	o := c.common(fs)
	listen := fs.String("listen", "127.0.0.1:8080", "the address to serve on; the dashboard has no authentication of its own")
	actions := fs.Bool("allow-actions", false, "enable replay, retry now and purge (read-only without it)")
	payloads := fs.Bool("show-payloads", false, "show payloads (they may hold personal data)")
	var maxAge ageFlag
	fs.Var(&maxAge, "max-pending-age", "warn when the oldest pending event is older than `D` (default 5m)")
	if _, err := parse(fs, args); err != nil {
		return err
	}
	t, err := c.open(ctx, o.resolved(), true, false)
	if err != nil {
		return err
	}
	defer t.close()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler: outboxui.Handler(t.db, t.ob, outboxui.Options{
			AllowActions: *actions, ShowPayloads: *payloads, MaxPendingAge: maxAge.d,
			// The hint under a hidden payload names this command's flag,
			// not the Go option.
			PayloadsHint: "restart outbox ui with --show-payloads",
			Logger:       slog.New(slog.NewTextHandler(c.stderr, nil)),
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	fmt.Fprintf(c.stderr, "outbox: dashboard on http://%s/ (Ctrl-C stops it)\n", ln.Addr())
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
