// Package outboxui is a dashboard for the outbox table: an [http.Handler]
// a service mounts behind its own authentication to see what is stuck,
// why, and put it back.
//
//	mux.Handle("/outbox/", outboxui.Handler(db, ob, outboxui.Options{AllowActions: true}))
//
// It renders plain HTML on the server (html/template, no front-end build;
// one small embedded script refreshes the overview and the list in place,
// and the pages work without it): a warning at the top of the overview and
// the list when events are pending and no relay runs, or when the oldest
// pending event is older than [Options.MaxPendingAge]; the counts by
// status with the age of the oldest pending event, the relays alive (when
// each last claimed and delivered, its last error); a list, newest first,
// with one search box (an event ID, an idempotency key, an aggregate as
// type:id, or an event type) and the same filters as the outbox command
// (status, type, aggregate, created since/until, error text), shown as
// they are in effect and paged both ways by seq, each pending event in
// backoff with its next attempt; an event's detail with its last error
// (marked when it predates a replay), history and the aggregate's
// previous and next events; and replay, retry-now and purge actions on
// one event, on the events ticked in the list, or on everything a filter
// matches.
//
// # Safety
//
// The handler has no authentication of its own: mount it behind the
// service's. It is read-only unless [Options.AllowActions] is set, and
// hides payloads (personal data) unless [Options.ShowPayloads] is set.
// Actions are POSTs, refused cross-origin by [http.CrossOriginProtection]
// and by a double-submit token. An action first shows a confirmation:
// how many events it will touch, by status, and the filter or selection in
// effect; its button runs it only if those counts still hold, and asks
// again otherwise. Each action is logged with who did it
// ([Options.Identity]). Every value is HTML-escaped by html/template
// (event types, aggregates, errors and payloads are user data), and the
// pages forbid framing and every script but the embedded live.js (no
// inline script) with a Content-Security-Policy.
//
// # Mounting
//
// Every page lives at one level of the path the handler is mounted at,
// and links are relative, so it works under any prefix, with or without
// [http.StripPrefix], as long as the mount path ends in a slash.
package outboxui
