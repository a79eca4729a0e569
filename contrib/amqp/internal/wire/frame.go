package wire

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
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

// frameStart appends a frame header of type t on channel ch, its size left for frameEnd, and
// returns where it starts.
func (w *Writer) frameStart(t uint8, ch uint16) int {
	at := len(w.B)
	w.B = append(w.B, t, byte(ch>>8), byte(ch), 0, 0, 0, 0)
	return at
}

// frameEnd completes the frame frameStart started at at.
func (w *Writer) frameEnd(at int) {
	binary.BigEndian.PutUint32(w.B[at+3:], uint32(len(w.B)-at-7))
	w.B = append(w.B, FrameEnd)
}

// MethodFrame appends a method frame. A connection's writer keeps one Writer, so that neither
// it nor its buffer is allocated per frame.
func (w *Writer) MethodFrame(ch uint16, m Method) {
	at := w.frameStart(FrameMethod, ch)
	class, method := m.ID()
	w.Short(class)
	w.Short(method)
	m.Write(w)
	w.frameEnd(at)
}

// ContentFrames appends a content header frame for the basic class and the body frames of
// body, each at most frameMax bytes long (0: no limit).
func (w *Writer) ContentFrames(ch uint16, props *BasicProperties, body []byte, frameMax uint32) {
	at := w.frameStart(FrameHeader, ch)
	w.Short(60) // basic
	w.Short(0)  // weight
	w.LongLong(uint64(len(body)))
	props.Write(w)
	w.frameEnd(at)
	room := len(body)
	if frameMax > 8 {
		room = int(frameMax) - 8
	}
	for len(body) > 0 {
		n := min(room, len(body))
		w.B = append(w.B, FrameBody, byte(ch>>8), byte(ch))
		w.B = binary.BigEndian.AppendUint32(w.B, uint32(n))
		w.B = append(append(w.B, body[:n]...), FrameEnd)
		body = body[n:]
	}
}

// Heartbeat appends a heartbeat frame.
func (w *Writer) Heartbeat() {
	w.B = append(w.B, FrameHeartbeat, 0, 0, 0, 0, 0, 0, FrameEnd)
}

// AppendMethod appends a method frame to buf.
func AppendMethod(buf []byte, ch uint16, m Method) []byte {
	w := Writer{B: buf}
	w.MethodFrame(ch, m)
	return w.B
}

// AppendContent appends a content header frame and body frames to buf, as
// [Writer.ContentFrames].
func AppendContent(buf []byte, ch uint16, props *BasicProperties, body []byte, frameMax uint32) []byte {
	w := Writer{B: buf}
	w.ContentFrames(ch, props, body, frameMax)
	return w.B
}

// AppendHeartbeat appends a heartbeat frame to buf.
func AppendHeartbeat(buf []byte) []byte {
	w := Writer{B: buf}
	w.Heartbeat()
	return w.B
}

// ReadMethod parses a method frame's payload. An unknown class or method fails with
// ErrUnknownMethod; arguments that do not parse, or bytes left over, with ErrMalformed.
func ReadMethod(payload []byte) (Method, error) { return readMethod(new(Reader), payload, nil) }

// MethodReader reads a connection's method frames and content headers, in the order they
// come, allocating as little as it can: it keeps its Reader; a small cache of the short
// strings it read (exchange names, routing keys, content types come again and again: one read
// before is returned rather than allocated again); and one value each of the methods a client
// sends per message (basic.publish, basic.ack), which every read of such a method returns
// again. A caller that keeps a method past the next read copies it.
type MethodReader struct {
	r       Reader
	strs    stringCache
	publish BasicPublish
	ack     BasicAck
}

// NewMethodReader returns a MethodReader.
func NewMethodReader() *MethodReader {
	mr := &MethodReader{strs: stringCache{seed: maphash.MakeSeed()}}
	mr.r.strs = &mr.strs
	return mr
}

// Method parses a method frame's payload, as [ReadMethod].
func (mr *MethodReader) Method(payload []byte) (Method, error) { return readMethod(&mr.r, payload, mr) }

// ContentHeader parses a content header frame's payload, as [ReadContentHeader].
func (mr *MethodReader) ContentHeader(payload []byte) (ContentHeader, error) {
	return readContentHeader(&mr.r, payload)
}

// reused returns the kept value of method class.method, zeroed, or nil for one not kept.
func (mr *MethodReader) reused(class, method uint16) Method {
	switch uint32(class)<<16 | uint32(method) {
	case 60<<16 | 40:
		mr.publish = BasicPublish{}
		return &mr.publish
	case 60<<16 | 80:
		mr.ack = BasicAck{}
		return &mr.ack
	}
	return nil
}

// readMethod parses a method with r, which it resets; from mr's kept values where it has one.
func readMethod(r *Reader, payload []byte, mr *MethodReader) (Method, error) {
	r.Reset(payload)
	class, method := r.Short(), r.Short()
	if r.err != nil {
		return nil, r.err
	}
	var m Method
	if mr != nil {
		m = mr.reused(class, method)
	}
	if m == nil {
		m = NewMethod(class, method)
	}
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

// stringCache is MethodReader's cache of short strings: direct-mapped, a string read replaces
// the one in its slot, so that it is bounded and costs a hash and a comparison per string.
type stringCache struct {
	seed  maphash.Seed
	slots [64]string
}

// get returns b as a string, the cached one when it is there.
func (c *stringCache) get(b []byte) string {
	i := maphash.Bytes(c.seed, b) % uint64(len(c.slots))
	if s := c.slots[i]; s == string(b) {
		return s
	}
	s := string(b)
	c.slots[i] = s
	return s
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
	return readContentHeader(new(Reader), payload)
}

func readContentHeader(r *Reader, payload []byte) (ContentHeader, error) {
	r.Reset(payload)
	h := ContentHeader{Class: r.Short()}
	r.Short() // weight
	h.BodySize = r.LongLong()
	h.Properties.Read(r)
	if r.err == nil && len(r.b) != 0 {
		r.fail("%d bytes after the properties", len(r.b))
	}
	return h, r.err
}
