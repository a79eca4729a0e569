// Package wire is AMQP 0-9-1 on the wire, for a server: frames, method arguments, content
// headers and field tables. The methods (methods_gen.go) are generated from the
// specification XML with RabbitMQ's extensions; the rest is written by hand.
package wire

//go:generate go run ./gen -o methods_gen.go
