package warren

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The log's records (record.go): each decodes to what was encoded, and nothing else decodes
// without an error.

// pub returns a publish record of body, as message msgID at seq in queue queueID.
func pub(msgID, queueID, seq uint64, body string) []byte {
	return appendPlacement(nil, placement{msgID: msgID, queueID: queueID, seq: seq}, []byte(body))
}

func TestRecordRoundTrip(t *testing.T) {
	p := placement{msgID: 7, queueID: 3, seq: 1 << 40, deadline: -5, returns: 9}
	for _, tc := range []struct {
		b    []byte
		want record
	}{
		{appendPlacement(nil, p, []byte("m")), record{typ: recPublish, placement: p, msg: []byte("m")}},
		{appendPlacement(nil, p, nil), record{typ: recEnqueue, placement: p}},
		{appendSeqRecord(nil, recDeliver, 3, 11, 0), record{typ: recDeliver, placement: placement{queueID: 3, seq: 11}}},
		{appendSeqRecord(nil, recSettle, 3, 12, 0), record{typ: recSettle, placement: placement{queueID: 3, seq: 12}}},
		{appendSeqRecord(nil, recReturn, 3, 13, 4), record{typ: recReturn, placement: placement{queueID: 3, seq: 13}, n: 4}},
		{appendSeqRecord(nil, recDelay, 3, 14, 1_700_000_000_000_000_000), record{typ: recDelay, placement: placement{queueID: 3, seq: 14}, n: 1_700_000_000_000_000_000}},
	} {
		got, err := decodeRecord(tc.b)
		require.NoError(t, err)
		require.Equal(t, tc.want, got)
	}
	for _, bad := range [][]byte{nil, {0}, {99}, {byte(recSettle)}, {byte(recSettle), 1}, append(appendSeqRecord(nil, recSettle, 1, 2, 0), 0), {byte(recPublish), 1, 1, 1, 0, 0}} {
		_, err := decodeRecord(bad)
		require.ErrorIs(t, err, errBadRecord, "%v", bad)
	}
}

// FuzzDecodeRecord: any bytes decode to a record or an error wrapping errBadRecord, never a
// panic; a record that decodes encodes back to the same bytes.
func FuzzDecodeRecord(f *testing.F) {
	f.Add(pub(1, 2, 3, "x"))
	f.Add(appendPlacement(nil, placement{msgID: 1, queueID: 2, seq: 3, deadline: -1, returns: 2}, nil))
	f.Add(appendSeqRecord(nil, recReturn, 1, 2, 3))
	f.Add(appendSeqRecord(nil, recDelay, 1, 2, -3))
	for _, tc := range declRecords {
		f.Add(appendDecl(nil, tc.typ, tc.d))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, err := decodeRecord(b)
		if err != nil {
			require.ErrorIs(t, err, errBadRecord)
			return
		}
		var again []byte
		switch rec.typ {
		case recPublish, recEnqueue:
			again = appendPlacement(nil, rec.placement, rec.msg)
		case recDeliver, recSettle, recReturn, recDelay:
			again = appendSeqRecord(nil, rec.typ, rec.queueID, rec.seq, rec.n)
		default:
			again = appendDecl(nil, rec.typ, rec.decl)
		}
		require.Equal(t, b, again, "one encoding per record")
		r := newReplay()
		r.apply(1, rec)
		replayed(r, rec.queueID)
	})
}

// declRecords are a topology record of each type.
var declRecords = []struct {
	typ recordType
	d   decl
}{
	{recQueue, decl{id: 4, name: "jobs", flags: flagDurable, args: Table{"x-max-length": int64(10)}}},
	{recUnqueue, decl{id: 4}},
	{recExchange, decl{name: "events", kind: ExchangeTopic, flags: flagDurable | flagInternal, alt: "lost"}},
	{recUnexchange, decl{name: "events"}},
	{recBind, decl{name: "events", dest: "jobs", flags: flagToQueue, kind: "a.*", args: Table{}}},
	{recUnbind, decl{name: "events", dest: "other", kind: "#"}},
}

func TestRecordDeclRoundTrip(t *testing.T) {
	for _, tc := range declRecords {
		rec, err := decodeRecord(appendDecl(nil, tc.typ, tc.d))
		require.NoError(t, err)
		require.Equal(t, tc.typ, rec.typ)
		require.Equal(t, tc.d, rec.decl)
	}
	b := appendDecl(nil, recQueue, decl{id: 1, name: "q", flags: flagDurable | flagInternal})
	_, err := decodeRecord(b)
	require.ErrorIs(t, err, errBadRecord, "a flag a queue cannot have")
}
