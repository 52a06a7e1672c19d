module github.com/gorm-outbox/outbox/tools/installcheck

go 1.26.8

require golang.org/x/mod v0.43.0
