module github.com/gorm-outbox/outbox/adapters/rabbitmq

go 1.26.8

require github.com/gorm-outbox/outbox v0.0.0

require github.com/rabbitmq/amqp091-go v1.16.0 // indirect

replace github.com/gorm-outbox/outbox => ../..
