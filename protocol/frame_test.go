package protocol

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

func TestReadFrame(t *testing.T) {
	cases := []struct {
		name    string
		in      []byte
		first   bool
		want    []byte // payload after the size
		wantErr error
	}{
		{"ok", []byte{0, 0, 0, 5, 1, 2, 3, 4, 5, 9}, false, []byte{1, 2, 3, 4, 5}, nil},
		{"too large", []byte{0, 0, 1, 0, 1}, false, nil, ErrFrameTooLarge},
		{"negative", []byte{0xff, 0xff, 0xff, 0xff}, false, nil, ErrFrameNegative},
		{"too small", []byte{0, 0, 0, 3, 1, 2, 3}, false, nil, ErrFrameNegative},
		{"truncated body", []byte{0, 0, 0, 10, 1, 2}, false, nil, ErrFrameTruncated},
		{"truncated size", []byte{0, 0}, false, nil, ErrFrameTruncated},
		{"empty", nil, false, nil, io.EOF},
		{"tls hello first", []byte{0x16, 0x03, 0x01, 0x00, 0xa5}, true, nil, ErrTLSOnPlaintext},
		{"tls-like later frame is just too large", []byte{0x16, 0x03, 0x01, 0x00, 0xa5}, false, nil, ErrFrameTooLarge},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var sz [4]byte
			f, err := ReadFrame(bytes.NewReader(tc.in), &sz, 255, tc.first)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if err == nil {
				if !bytes.Equal(f[4:], tc.want) || !bytes.Equal(f[:4], tc.in[:4]) {
					t.Fatalf("frame = %v, want size prefix + %v", f, tc.want)
				}
				ReleaseFrame(f)
			}
		})
	}
}

func TestReadFrameReusesPooledBuffers(t *testing.T) {
	in := []byte{0, 0, 0, 6, 0, 18, 0, 0, 0, 1}
	var sz [4]byte
	allocs := testing.AllocsPerRun(200, func() {
		f, err := ReadFrame(bytes.NewReader(in), &sz, 1<<20, false)
		if err != nil {
			t.Fatal(err)
		}
		ReleaseFrame(f)
	})
	// bytes.NewReader itself allocates once; the frame buffer must not.
	if allocs > 1 {
		t.Fatalf("ReadFrame allocates %.1f times per frame, want pooled buffers", allocs)
	}
}

func header(key, version int16, corr int32, clientID *string, tags []byte, body []byte) []byte {
	var b []byte
	b = append(b, byte(key>>8), byte(key), byte(version>>8), byte(version))
	b = append(b, byte(corr>>24), byte(corr>>16), byte(corr>>8), byte(corr))
	if clientID == nil {
		b = append(b, 0xff, 0xff)
	} else {
		b = append(b, byte(len(*clientID)>>8), byte(len(*clientID)))
		b = append(b, *clientID...)
	}
	b = append(b, tags...)
	return append(b, body...)
}

func TestParseRequestHeader(t *testing.T) {
	id := "my-client"
	cases := []struct {
		name     string
		in       []byte
		want     RequestHeader
		clientID string
		errPart  string
	}{
		{"metadata v1 header", header(3, 4, 7, &id, nil, []byte{0xAA}),
			RequestHeader{APIKey: 3, APIVersion: 4, CorrelationID: 7, BodyOffset: 19}, id, ""},
		{"null client id", header(1, 3, -5, nil, nil, nil),
			RequestHeader{APIKey: 1, APIVersion: 3, CorrelationID: -5, BodyOffset: 10}, "", ""},
		{"flexible v2 header no tags", header(3, 12, 9, &id, []byte{0}, []byte{1}),
			RequestHeader{APIKey: 3, APIVersion: 12, CorrelationID: 9, Flexible: true, BodyOffset: 20}, id, ""},
		{"flexible v2 header with two tags", header(18, 3, 1, &id, []byte{2, 0, 2, 0xab, 0xcd, 5, 1, 0xee}, nil),
			RequestHeader{APIKey: 18, APIVersion: 3, CorrelationID: 1, Flexible: true, BodyOffset: 27}, id, ""},
		{"api versions v2 is not flexible", header(18, 2, 1, &id, nil, []byte{0}),
			RequestHeader{APIKey: 18, APIVersion: 2, CorrelationID: 1, BodyOffset: 19}, id, ""},
		{"unknown key forwarded as v1", header(999, 0, 1, nil, nil, nil),
			RequestHeader{APIKey: 999, CorrelationID: 1, BodyOffset: 10}, "", ""},
		{"short", []byte{0, 3, 0, 1}, RequestHeader{}, "", "need at least 10"},
		{"negative key", header(-2, 0, 1, nil, nil, nil), RequestHeader{}, "", "negative api key"},
		{"negative version", header(3, -1, 1, nil, nil, nil), RequestHeader{}, "", "negative api version"},
		{"client id overruns", header(3, 1, 1, nil, nil, nil)[:8:8], RequestHeader{}, "", "need at least 10"},
		{"client id length too big", append(header(3, 1, 1, nil, nil, nil)[:8], 0, 50, 'a'), RequestHeader{}, "", "overruns"},
		{"client id length -2", append(header(3, 1, 1, nil, nil, nil)[:8], 0xff, 0xfe), RequestHeader{}, "", "client id length -2"},
		{"tag overruns", header(3, 12, 1, nil, []byte{1, 0, 9, 1}, nil), RequestHeader{}, "", "tagged fields"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h, err := ParseRequestHeader(tc.in)
			if tc.errPart != "" {
				if err == nil || !errors.Is(err, ErrBadHeader) || !bytes.Contains([]byte(err.Error()), []byte(tc.errPart)) {
					t.Fatalf("err = %v, want ErrBadHeader containing %q", err, tc.errPart)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(h.ClientID) != tc.clientID {
				t.Errorf("client id %q, want %q", h.ClientID, tc.clientID)
			}
			if h.APIKey != tc.want.APIKey || h.APIVersion != tc.want.APIVersion || h.CorrelationID != tc.want.CorrelationID ||
				h.Flexible != tc.want.Flexible || h.BodyOffset != tc.want.BodyOffset {
				t.Fatalf("header = %+v, want %+v", h, tc.want)
			}
		})
	}
}

func TestProduceAcks(t *testing.T) {
	for _, v := range []int16{0, 2, 3, 7, 8, 9, 11, 13} {
		for _, txn := range []*string{nil, kmsg.StringPtr("txn-1")} {
			for _, acks := range []int16{0, 1, -1} {
				r := kmsg.NewPtrProduceRequest()
				r.SetVersion(v)
				r.Acks = acks
				r.TransactionID = txn
				p := rawRequest(r, 3)[4:]
				h, err := ParseRequestHeader(p)
				if err != nil {
					t.Fatal(err)
				}
				got, err := produceAcks(p, h)
				if err != nil || got != acks {
					t.Fatalf("v%d txn=%v: acks = %d, %v; want %d", v, txn != nil, got, err, acks)
				}
			}
		}
	}
	// Truncated before acks.
	h := RequestHeader{APIKey: 0, APIVersion: 9, Flexible: true, BodyOffset: 0}
	if _, err := produceAcks([]byte{10, 'a'}, h); err == nil {
		t.Fatal("truncated produce: want error")
	}
}

func TestResponseHeaderFlexibility(t *testing.T) {
	if responseHeaderFlexible(18, 3) {
		t.Error("ApiVersions v3 response header must be v0")
	}
	if !responseHeaderFlexible(3, 9) || responseHeaderFlexible(3, 8) {
		t.Error("Metadata response header flexible from v9")
	}
	off, err := responseBodyOffset([]byte{0, 0, 0, 1, 1, 0, 1, 7, 42}, 3, 12)
	if err != nil || off != 8 {
		t.Fatalf("body offset %d, %v; want 8", off, err)
	}
}

func TestReadFrameHeadAndCopyBody(t *testing.T) {
	payload := make([]byte, streamAbove+10000)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	in := append([]byte{0, 0, 0, 0}, payload...)
	in[0], in[1], in[2], in[3] = byte(len(payload)>>24), byte(len(payload)>>16), byte(len(payload)>>8), byte(len(payload))
	var sz [4]byte
	r := bytes.NewReader(in)
	head, rest, err := readFrameHead(r, &sz, 1<<20, true)
	if err != nil || len(head) != 4+headBytes || rest != len(payload)-headBytes {
		t.Fatalf("head %d bytes, rest %d, err %v", len(head), rest, err)
	}
	var out bytes.Buffer
	out.Write(head)
	if err := copyBody(&out, r, rest); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), in) {
		t.Fatal("head + streamed body differ from the frame")
	}
	// A body cut short is a truncated frame.
	r = bytes.NewReader(in[:len(in)-1])
	head, rest, _ = readFrameHead(r, &sz, 1<<20, false)
	if err := copyBody(io.Discard, r, rest); !errors.Is(err, ErrFrameTruncated) {
		t.Fatalf("short body: err = %v, want ErrFrameTruncated", err)
	}
	// Small frames come back whole.
	head, rest, err = readFrameHead(bytes.NewReader([]byte{0, 0, 0, 5, 1, 2, 3, 4, 5}), &sz, 1<<20, false)
	if err != nil || rest != 0 || !bytes.Equal(head[4:], []byte{1, 2, 3, 4, 5}) {
		t.Fatalf("small frame: %v %d %v", head, rest, err)
	}
}
