// The documentation's pictures (docs/images/outboxui: the dashboard's
// screenshots, megabytes of them). This directory is a module of its own, never
// tagged or published, only so that the module zips users download leave
// them out: a directory holding a go.mod is not part of the module around
// it. Nothing imports it.
module github.com/gorm-outbox/outbox/docs/images

go 1.26.0
