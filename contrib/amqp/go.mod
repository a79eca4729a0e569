module github.com/warrenmq/warren/contrib/amqp

go 1.26.0

replace github.com/warrenmq/warren => ../..

require (
	github.com/rabbitmq/amqp091-go v1.16.0
	github.com/stretchr/testify v1.12.1
	github.com/warrenmq/warren v0.0.0-00010101000000-000000000000
	go.uber.org/goleak v1.3.0
)

require (
	github.com/google/btree v1.1.3 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
)
