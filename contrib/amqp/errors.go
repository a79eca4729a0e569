package amqp

import (
	"errors"
	"fmt"
	"strings"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/contrib/amqp/internal/wire"
)

// amqpError is an AMQP exception: a reply code and text, the method that caused it, and
// whether it closes the connection (a hard error) or only the channel (a soft one).
type amqpError struct {
	code             uint16
	text             string
	class, method    uint16
	closesConnection bool
}

func (e *amqpError) Error() string { return fmt.Sprintf("amqp: %d %s", e.code, e.text) }

// errConnectionForced ends connections when the server closes.
var errConnectionForced = errors.New("CONNECTION_FORCED")

// hard reports whether code is one of AMQP's connection errors.
func hard(code uint16) bool {
	switch code {
	case wire.ConnectionForced, wire.InvalidPath, wire.FrameError, wire.SyntaxError, wire.CommandInvalid,
		wire.ChannelError, wire.UnexpectedFrame, wire.ResourceError, wire.NotAllowed, wire.NotImplemented,
		wire.InternalError:
		return true
	}
	return false
}

// replyText is RabbitMQ's name of a reply code, which starts its reply texts.
var replyText = map[uint16]string{
	wire.NoRoute: "NO_ROUTE", wire.ConnectionForced: "CONNECTION_FORCED", wire.AccessRefused: "ACCESS_REFUSED",
	wire.NotFound: "NOT_FOUND", wire.ResourceLocked: "RESOURCE_LOCKED", wire.PreconditionFailed: "PRECONDITION_FAILED",
	wire.FrameError: "FRAME_ERROR", wire.SyntaxError: "SYNTAX_ERROR", wire.CommandInvalid: "COMMAND_INVALID",
	wire.ChannelError: "CHANNEL_ERROR", wire.UnexpectedFrame: "UNEXPECTED_FRAME", wire.ResourceError: "RESOURCE_ERROR",
	wire.NotAllowed: "NOT_ALLOWED", wire.NotImplemented: "NOT_IMPLEMENTED", wire.InternalError: "INTERNAL_ERROR",
}

// exception returns the AMQP exception of code with a text, caused by method m (nil: none).
func exception(code uint16, m wire.Method, format string, args ...any) *amqpError {
	e := &amqpError{code: code, text: replyText[code] + " - " + fmt.Sprintf(format, args...), closesConnection: hard(code)}
	if m != nil {
		e.class, e.method = m.ID()
	}
	if len(e.text) > 255 {
		e.text = e.text[:255]
	}
	return e
}

// failure returns the AMQP exception for warren's error err of method m, by warren's sentinel:
// the reply code RabbitMQ gives in the same case.
func failure(m wire.Method, err error) *amqpError {
	var ae *amqpError
	if errors.As(err, &ae) {
		return ae
	}
	text := strings.TrimPrefix(err.Error(), "warren: ")
	switch {
	case errors.Is(err, warren.ErrNotFound):
		return exception(wire.NotFound, m, "%s", text)
	case errors.Is(err, warren.ErrResourceLocked):
		return exception(wire.ResourceLocked, m, "%s", text)
	case errors.Is(err, warren.ErrAccessRefused):
		return exception(wire.AccessRefused, m, "%s", text)
	case errors.Is(err, warren.ErrPreconditionFailed), errors.Is(err, warren.ErrInvalidArgument),
		errors.Is(err, warren.ErrUnknownDelivery), errors.Is(err, warren.ErrAlreadySettled):
		return exception(wire.PreconditionFailed, m, "%s", text)
	case errors.Is(err, warren.ErrUnsupported):
		return exception(wire.NotImplemented, m, "%s", text)
	case errors.Is(err, warren.ErrClosed), errors.Is(err, errConnectionForced):
		return exception(wire.ConnectionForced, m, "%s", text)
	}
	return exception(wire.InternalError, m, "%s", text)
}
