// Package outagetest is the broker adapters' shared rig for outage tests:
// an outbox on SQLite with a steady writer and a running relay, whose
// handler is the adapter under test, and a slog handler that records what
// the relay and the adapter log. It lives in the core module, internal to
// this repository, so that the adapters' modules share one copy.
package outagetest
