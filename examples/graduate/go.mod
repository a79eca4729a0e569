module github.com/warrenmq/warren/examples/graduate

go 1.25.0

require (
	github.com/stretchr/testify v1.12.1
	github.com/warrenmq/warren v0.0.0-00010101000000-000000000000
	github.com/warrenmq/warren/contrib/rabbitmq v0.0.0-00010101000000-000000000000
)

require (
	github.com/google/btree v1.1.3 // indirect
	github.com/rabbitmq/amqp091-go v1.16.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
)

replace (
	github.com/warrenmq/warren => ../..
	github.com/warrenmq/warren/contrib/rabbitmq => ../../contrib/rabbitmq
)
