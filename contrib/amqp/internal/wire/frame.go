package wire

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Frame is one AMQP frame: its type (FrameMethod, FrameHeader, FrameBody, FrameHeartbeat), its
// channel and its payload.
type Frame struct {
	Type    uint8
	Channel uint16
	Payload []byte
}

// ErrFrameTooLarge is the error of a frame larger than the negotiated frame-max.
var ErrFrameTooLarge = errors.New("amqp: frame too large")

// FrameReader reads frames, reusing one buffer: a frame's payload is valid until the next
// Read.
type FrameReader struct {
	r   *bufio.Reader
	buf []byte
	hdr [7]byte
	// Max is the largest frame, header and end included, that Read accepts (frame-max); 0
	// for FrameMinSize.
	Max uint32
}

// NewFrameReader reads frames from r.
func NewFrameReader(r io.Reader) *FrameReader {
	return &FrameReader{r: bufio.NewReaderSize(r, 64<<10)}
}

// Buffered returns the reader's buffered input, for the protocol header read before frames.
func (fr *FrameReader) Buffered() *bufio.Reader { return fr.r }

// Read reads the next frame. A frame over Max fails with ErrFrameTooLarge, one that does not
// end with FrameEnd with ErrMalformed; io errors are returned as they are.
func (fr *FrameReader) Read() (Frame, error) {
	h := fr.hdr[:]
	if _, err := io.ReadFull(fr.r, h); err != nil {
		return Frame{}, err
	}
	f := Frame{Type: h[0], Channel: binary.BigEndian.Uint16(h[1:3])}
	size := binary.BigEndian.Uint32(h[3:7])
	limit := fr.Max
	if limit == 0 {
		limit = FrameMinSize
	}
	if uint64(size)+8 > uint64(limit) {
		return Frame{}, fmt.Errorf("%w: %d bytes, frame-max %d", ErrFrameTooLarge, uint64(size)+8, limit)
	}
	if cap(fr.buf) < int(size)+1 {
		fr.buf = make([]byte, int(size)+1, max(int(size)+1, 4096))
	}
	b := fr.buf[:size+1]
	if _, err := io.ReadFull(fr.r, b); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return Frame{}, err
	}
	if b[size] != FrameEnd {
		return Frame{}, fmt.Errorf("%w: frame end %#x, want %#x", ErrMalformed, b[size], FrameEnd)
	}
	f.Payload = b[:size:size]
	return f, nil
}

// appendFrame appends a frame of type t on channel ch whose payload write appends.
func appendFrame(buf []byte, t uint8, ch uint16, write func(w *Writer)) []byte {
	at := len(buf)
	w := Writer{B: append(buf, t, byte(ch>>8), byte(ch), 0, 0, 0, 0)}
	write(&w)
	binary.BigEndian.PutUint32(w.B[at+3:], uint32(len(w.B)-at-7))
	return append(w.B, FrameEnd)
}

// AppendMethod appends a method frame.
func AppendMethod(buf []byte, ch uint16, m Method) []byte {
	return appendFrame(buf, FrameMethod, ch, func(w *Writer) {
		class, method := m.ID()
		w.Short(class)
		w.Short(method)
		m.Write(w)
	})
}

// AppendContent appends a content header frame for the basic class and the body frames of
// body, each at most frameMax bytes long (0: no limit).
func AppendContent(buf []byte, ch uint16, props *BasicProperties, body []byte, frameMax uint32) []byte {
	buf = appendFrame(buf, FrameHeader, ch, func(w *Writer) {
		w.Short(60) // basic
		w.Short(0)  // weight
		w.LongLong(uint64(len(body)))
		props.Write(w)
	})
	room := len(body)
	if frameMax > 8 {
		room = int(frameMax) - 8
	}
	for len(body) > 0 {
		n := min(room, len(body))
		buf = append(buf, FrameBody, byte(ch>>8), byte(ch))
		buf = binary.BigEndian.AppendUint32(buf, uint32(n))
		buf = append(append(buf, body[:n]...), FrameEnd)
		body = body[n:]
	}
	return buf
}

// AppendHeartbeat appends a heartbeat frame.
func AppendHeartbeat(buf []byte) []byte {
	return append(buf, FrameHeartbeat, 0, 0, 0, 0, 0, 0, FrameEnd)
}

// ReadMethod parses a method frame's payload. An unknown class or method fails with
// ErrUnknownMethod; arguments that do not parse, or bytes left over, with ErrMalformed.
func ReadMethod(payload []byte) (Method, error) { return ReadMethodWith(new(Reader), payload) }

// ReadMethodWith is ReadMethod with r, which it resets: a reader of many frames keeps one.
func ReadMethodWith(r *Reader, payload []byte) (Method, error) {
	r.Reset(payload)
	class, method := r.Short(), r.Short()
	if r.err != nil {
		return nil, r.err
	}
	m := NewMethod(class, method)
	if m == nil {
		return nil, fmt.Errorf("%w: class %d, method %d", ErrUnknownMethod, class, method)
	}
	m.Read(r)
	if r.err != nil {
		return nil, fmt.Errorf("%s: %w", m.Name(), r.err)
	}
	if len(r.b) != 0 {
		return nil, fmt.Errorf("%s: %w: %d bytes after the arguments", m.Name(), ErrMalformed, len(r.b))
	}
	return m, nil
}

// ErrUnknownMethod is the error of a method the specification does not have.
var ErrUnknownMethod = errors.New("amqp: unknown method")

// ContentHeader is a content header frame's payload.
type ContentHeader struct {
	Class      uint16
	BodySize   uint64
	Properties BasicProperties
}

// ReadContentHeader parses a content header frame's payload.
func ReadContentHeader(payload []byte) (ContentHeader, error) {
	r := NewReader(payload)
	h := ContentHeader{Class: r.Short()}
	r.Short() // weight
	h.BodySize = r.LongLong()
	h.Properties.Read(r)
	if r.err == nil && len(r.b) != 0 {
		r.fail("%d bytes after the properties", len(r.b))
	}
	return h, r.err
}
