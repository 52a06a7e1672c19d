package outboxui

import (
	"net/http"

	"github.com/gorm-outbox/outbox"
)

func (h *handler) overview(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	st, err := h.ob.Stats(h.db.WithContext(ctx).WithContext(ctx))
	if err != nil {
		h.dbError(w, r, "stats", err)
		return
	}
	failed, err := h.ob.List(h.db.WithContext(ctx).WithContext(ctx), outbox.ListParams{
		Filter: outbox.Filter{Statuses: []outbox.Status{outbox.StatusFailed}}, Limit: 10,
	})

	if err != nil {
		h.dbError(w, r, "list failed events", err)
		return
	}
	h.render(w, r, http.StatusOK, "overview.html", struct {
		base
		Stats  outbox.Stats
		Failed []outbox.Row
	}{h.live(h.base(w, r, "overview")), st, failed})
}
