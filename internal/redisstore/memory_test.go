package redisstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/testing/redistest"
)

// TestRecordMemory holds Redis's own account (MEMORY USAGE) of one record to
// these bounds: at most 200 bytes in flight, at most 1.5 KiB once
// completed with a 1 KiB body. A hash holding that body would be converted
// to a hashtable and take about 2.1 KiB; the completed record is a string
// for that reason (codec.go). The figures are Redis's allocator's sizes, the
// same on every run of one Redis version: nothing here depends on timing.
func TestRecordMemory(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	st := redistest.OpenStore(t, srv.URL(), time.Second)
	rdb := srv.Client()
	ctx := context.Background()

	id := idem.RecordIDFor("default", "api.example.com", "4f1c2a7e-6b1d-4c55-9a0e-1e2b3c4d5e6f")
	tok := idem.NewToken()
	var fp idem.Fingerprint
	fp[0] = 1
	if _, err := st.Reserve(ctx, idem.Reservation{ID: id, Fingerprint: fp, Token: tok, Lease: 30 * time.Second,
		Retention: 24 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	usage := func() int64 {
		t.Helper()
		n, err := rdb.MemoryUsage(ctx, st.Key(id), 0).Result()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("MEMORY USAGE %d bytes (OBJECT ENCODING %s)", n, rdb.ObjectEncoding(ctx, st.Key(id)).Val())
		return n
	}
	if n := usage(); n > 200 {
		t.Errorf("in-flight record: MEMORY USAGE %d bytes, want <= 200", n)
	}
	resp := idem.Response{Status: 201, Body: []byte(strings.Repeat("x", 1024)), Headers: []idem.Header{
		{Name: "content-type", Value: "application/json"}, {Name: "location", Value: "/orders/12345"},
	}}
	if err := st.Complete(ctx, id, tok, resp, 24*time.Hour); err != nil {
		t.Fatal(err)
	}
	if n := usage(); n > 1536 {
		t.Errorf("completed record, 1 KiB body: MEMORY USAGE %d bytes, want <= 1536", n)
	}
	// A replay rewrites the attempt count in place, not the record.
	if _, err := st.Reserve(ctx, idem.Reservation{ID: id, Fingerprint: fp, Token: idem.NewToken(),
		Lease: 30 * time.Second, Retention: 24 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	if n := usage(); n > 1536 {
		t.Errorf("completed record after a replay: MEMORY USAGE %d bytes, want <= 1536", n)
	}
	if ttl := rdb.PTTL(ctx, st.Key(id)).Val(); ttl < 23*time.Hour {
		t.Errorf("retention after a replay: %v left, want about 24h", ttl)
	}
}
