package redisstore_test

import (
	"context"
	"flag"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/testing/redistest"
)

var updateGolden = flag.Bool("update-golden", false, "rewrite the testdata records of the layout the store writes now")

// goldenRecords are completed records as Redis holds them (the string
// complete.lua writes), kept byte for byte in testdata: the first three
// were written by the store before responses could be compressed, in the
// layout with a decimal attempt count and creation time; the fourth in
// the compact layout, before records held their length; the last in the
// sized layout (codec.go). All must keep replaying whatever changes in
// the codec, and only the records of the layout written now (current) are
// rewritten by -update-golden.
var goldenRecords = []struct {
	file    string
	resp    idem.Response
	current bool
}{
	{"testdata/completed-plain.record", idem.Response{Status: 201, Headers: []idem.Header{
		{Name: "content-type", Value: "application/json"}, {Name: "location", Value: "/v1/orders/ord_1"},
		{Name: "x-dup", Value: "a"}, {Name: "x-dup", Value: ""},
	}, Body: []byte(`{"id":"ord_1","object":"order","amount":1999,"currency":"eur","status":"created"}`)}, false},
	{"testdata/completed-omitted.record", idem.Response{Status: 200, Headers: []idem.Header{
		{Name: "content-type", Value: "text/plain"}}, BodyOmitted: true}, false},
	{"testdata/completed-sealed.record", idem.Response{Status: 201, Body: []byte("\x02\x02k1-sealed-envelope"), Sealed: true}, false},
	{"testdata/completed-compact.record", idem.Response{Status: 201, Headers: []idem.Header{
		{Name: "content-type", Value: "application/json"}, {Name: "location", Value: "/v1/orders/ord_2"},
	}, Body: []byte(`{"id":"ord_2","object":"order","amount":2500,"currency":"usd","status":"created"}`)}, false},
	{"testdata/completed-sized.record", idem.Response{Status: 201, Headers: []idem.Header{
		{Name: "content-type", Value: "application/json"}, {Name: "location", Value: "/v1/orders/ord_3"},
	}, Body: []byte(`{"id":"ord_3","object":"order","amount":4200,"currency":"gbp","status":"created"}`)}, true},
}

var goldenFP = idem.Fingerprint{0xaa, 0xbb}

// TestGoldenRecordsReplay: records written before this version replay
// as they were stored.
func TestGoldenRecordsReplay(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	st := redistest.OpenStore(t, srv.URL(), time.Second)
	ctx := context.Background()
	for i, g := range goldenRecords {
		id := idem.RecordIDFor("golden", "scope", g.file)
		if *updateGolden && g.current {
			tok := idem.Token{byte(i + 1)}
			if _, err := st.Reserve(ctx, idem.Reservation{ID: id, Fingerprint: goldenFP, Token: tok,
				Lease: time.Minute, Retention: time.Hour}); err != nil {
				t.Fatal(err)
			}
			if err := st.Complete(ctx, id, tok, g.resp, time.Hour); err != nil {
				t.Fatal(err)
			}
			raw, err := srv.Client().Get(ctx, st.Key(id)).Bytes()
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(g.file, raw, 0o644); err != nil {
				t.Fatal(err)
			}
			srv.Client().Del(ctx, st.Key(id))
		}
		raw, err := os.ReadFile(g.file)
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Client().Set(ctx, st.Key(id), raw, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		res, err := st.Reserve(ctx, idem.Reservation{ID: id, Fingerprint: goldenFP, Token: idem.NewToken(),
			Lease: time.Minute, Retention: time.Hour})
		if err != nil || res.Outcome != idem.Completed || res.Attempt != 2 {
			t.Fatalf("%s: %v, attempt %d, %v", g.file, res.Outcome, res.Attempt, err)
		}
		got := res.Response
		if got.Status != g.resp.Status || string(got.Body) != string(g.resp.Body) || !slices.Equal(got.Headers, g.resp.Headers) ||
			got.BodyOmitted != g.resp.BodyOmitted || got.Sealed != g.resp.Sealed || got.Compressed {
			t.Fatalf("%s replays as %+v\nwant %+v", g.file, got, g.resp)
		}
		// The replay counted in the record's own layout.
		rec, err := st.Get(ctx, id)
		if err != nil || rec.Attempts != 2 || rec.Token != (idem.Token{byte(i + 1)}) || rec.Fingerprint != goldenFP {
			t.Fatalf("%s after a replay: %+v, %v", g.file, rec, err)
		}
		if after := srv.Client().Get(ctx, st.Key(id)).Val(); after[0] != raw[0] || len(after) != len(raw) {
			t.Fatalf("%s: a replay rewrote the record as %q", g.file, after)
		}
	}
}
