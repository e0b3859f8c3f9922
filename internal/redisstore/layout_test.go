package redisstore_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/redisstore"
	"github.com/idem-extproc/idem-extproc/internal/redisstore/scripts"
	"github.com/idem-extproc/idem-extproc/internal/testing/redistest"
)

// sizedRecord is a completed record as complete.lua writes it, built
// here from the layout codec.go documents rather than from the codec:
// "e", fingerprint, token, attempts (4 bytes big-endian), created Unix ms
// (6 bytes big-endian), the whole string's length (4 bytes big-endian),
// the response head, the body.
func sizedRecord(fp idem.Fingerprint, tok idem.Token, attempts uint32, createdMs int64, resp *idem.Response) []byte {
	c := compactRecord(fp, tok, attempts, createdMs, resp)
	b := append([]byte{'e'}, c[1:compactHeadLen]...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(c)+sizedHeadLen-compactHeadLen))
	return append(b, c[compactHeadLen:]...)
}

// compactRecord is a completed record as the build before the sized
// layout wrote it: "d", then the same head less the length, then the
// response head and the body.
func compactRecord(fp idem.Fingerprint, tok idem.Token, attempts uint32, createdMs int64, resp *idem.Response) []byte {
	b := []byte{'d'}
	b = append(b, fp[:]...)
	b = append(b, tok[:]...)
	b = binary.BigEndian.AppendUint32(b, attempts)
	b = binary.BigEndian.AppendUint16(b, uint16(createdMs>>32))
	b = binary.BigEndian.AppendUint32(b, uint32(createdMs))
	b = append(b, redisstore.EncodeHead(resp)...)
	return append(b, resp.Body...)
}

// The fixed heads: compactRecord's 1 + 32 + 16 + 4 + 6, sizedRecord's 4
// more.
const (
	compactHeadLen = 59
	sizedHeadLen   = 63
)

// binaryLayouts are the layouts whose attempts and creation time are
// binary, each as a test builds its records.
var binaryLayouts = []struct {
	name   string
	record func(idem.Fingerprint, idem.Token, uint32, int64, *idem.Response) []byte
}{{"sized", sizedRecord}, {"compact", compactRecord}}

type layoutEnv struct {
	t   *testing.T
	srv *redistest.Server
	st  *redisstore.Store
}

func newLayoutEnv(t *testing.T) *layoutEnv {
	srv := redistest.Start(t, redistest.Options{})
	return &layoutEnv{t: t, srv: srv, st: redistest.OpenStore(t, srv.URL(), 5*time.Second)}
}

func (e *layoutEnv) raw(id idem.RecordID) []byte {
	e.t.Helper()
	b, err := e.srv.Client().Get(context.Background(), e.st.Key(id)).Bytes()
	if err != nil {
		e.t.Fatal(err)
	}
	return b
}

func (e *layoutEnv) put(id idem.RecordID, rec []byte) {
	e.t.Helper()
	if err := e.srv.Client().Set(context.Background(), e.st.Key(id), rec, time.Hour).Err(); err != nil {
		e.t.Fatal(err)
	}
}

// replay reserves id with a new token and wants a replay of attempt want.
func (e *layoutEnv) replay(id idem.RecordID, fp idem.Fingerprint, want int) idem.ReserveResult {
	e.t.Helper()
	res, err := e.st.Reserve(context.Background(), idem.Reservation{ID: id, Fingerprint: fp, Token: idem.NewToken(),
		Lease: time.Minute, Retention: time.Hour})
	if err != nil || res.Outcome != idem.Completed || res.Attempt != want {
		e.t.Fatalf("replay: %v, attempt %d, %v; want completed, attempt %d", res.Outcome, res.Attempt, err, want)
	}
	return res
}

func (e *layoutEnv) attempts(id idem.RecordID) int {
	e.t.Helper()
	rec, err := e.st.Get(context.Background(), id)
	if err != nil {
		e.t.Fatal(err)
	}
	return rec.Attempts
}

// TestCompletedRecordLayout: a completed record is the sized string,
// byte for byte, whether complete or an operator's resolve wrote it: a
// 63-byte head and the response, nothing else.
func TestCompletedRecordLayout(t *testing.T) {
	e := newLayoutEnv(t)
	ctx := context.Background()
	fp := idem.Fingerprint{1, 2, 3, 31: 0xff}
	resp := idem.Response{Status: 201, Headers: []idem.Header{{Name: "content-type", Value: "application/json"}},
		Body: []byte(`{"id":"ord_1"}`)}

	id := idem.RecordIDFor("p", "scope", "layout")
	tok := idem.NewToken()
	first, err := e.st.Reserve(ctx, idem.Reservation{ID: id, Fingerprint: fp, Token: tok, Lease: time.Minute,
		Retention: time.Hour})
	if err != nil || first.Outcome != idem.Reserved {
		t.Fatalf("reserve: %v, %v", first.Outcome, err)
	}
	if err := e.st.Complete(ctx, id, tok, resp, time.Hour); err != nil {
		t.Fatal(err)
	}
	created := first.CreatedAt.UnixMilli()
	want := sizedRecord(fp, tok, 1, created, &resp)
	got := e.raw(id)
	if !bytes.Equal(got, want) {
		t.Fatalf("stored record\n%q\nwant\n%q", got, want)
	}
	if n := len(redisstore.EncodeHead(&resp)) + len(resp.Body) + sizedHeadLen; len(got) != n {
		t.Fatalf("stored record is %d bytes, want %d", len(got), n)
	}
	res := e.replay(id, fp, 2)
	if !res.CreatedAt.Equal(first.CreatedAt) || res.Response.Status != 201 || string(res.Response.Body) != string(resp.Body) {
		t.Fatalf("replay: %+v", res)
	}
	// The replay rewrote the attempt count in place and nothing else.
	if got, want := e.raw(id), sizedRecord(fp, tok, 2, created, &resp); !bytes.Equal(got, want) {
		t.Fatalf("after a replay\n%q\nwant\n%q", got, want)
	}
	rec, err := e.st.Get(ctx, id)
	if err != nil || rec.State != idem.StateCompleted || rec.Attempts != 2 || rec.Token != tok || rec.Fingerprint != fp ||
		rec.CreatedAt.UnixMilli() != created || string(rec.Response.Body) != string(resp.Body) {
		t.Fatalf("get: %+v, %v", rec, err)
	}

	// resolve writes the same string as complete.
	id = idem.RecordIDFor("p", "scope", "layout-resolved")
	tok = idem.NewToken()
	first, err = e.st.Reserve(ctx, idem.Reservation{ID: id, Fingerprint: fp, Token: tok, Lease: time.Minute,
		Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.st.MarkUnknown(ctx, id, tok, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := e.st.Resolve(ctx, id, &resp, time.Hour); err != nil {
		t.Fatal(err)
	}
	if got, want := e.raw(id), sizedRecord(fp, tok, 1, first.CreatedAt.UnixMilli(), &resp); !bytes.Equal(got, want) {
		t.Fatalf("resolved record\n%q\nwant\n%q", got, want)
	}
	e.replay(id, fp, 2)
}

// TestCompletedRecordCountsReplays: the binary attempt count goes up by
// one on every replay, across its bytes' carries (255 to 256, 65 535 to
// 65 536), and Get reads it, in both layouts that hold it.
func TestCompletedRecordCountsReplays(t *testing.T) {
	e := newLayoutEnv(t)
	fp := idem.Fingerprint{7}
	resp := idem.Response{Status: 200, Body: []byte("ok")}
	for _, l := range binaryLayouts {
		for _, start := range []uint32{1, 65_500} {
			id := idem.RecordIDFor("p", "scope", "replays-"+l.name)
			e.put(id, l.record(fp, idem.Token{9}, start, 1_700_000_000_123, &resp))
			for i := range 300 {
				res := e.replay(id, fp, int(start)+i+1)
				if res.CreatedAt.UnixMilli() != 1_700_000_000_123 {
					t.Fatalf("%s: created %d", l.name, res.CreatedAt.UnixMilli())
				}
			}
			if n := e.attempts(id); n != int(start)+300 {
				t.Fatalf("%s from %d: %d attempts counted, want %d", l.name, start, n, start+300)
			}
			if got, want := e.raw(id), l.record(fp, idem.Token{9}, start+300, 1_700_000_000_123, &resp); !bytes.Equal(got, want) {
				t.Fatalf("%s from %d: record\n%q\nwant\n%q", l.name, start, got, want)
			}
		}
	}
}

// TestCompletedRecordAttemptsSaturate: the 4-byte count stops at
// 2^32-1 rather than wrapping to 0; the record still replays, every
// replay past it reported as attempt 2^32-1.
func TestCompletedRecordAttemptsSaturate(t *testing.T) {
	e := newLayoutEnv(t)
	fp := idem.Fingerprint{7}
	resp := idem.Response{Status: 200, Body: []byte("ok")}
	id := idem.RecordIDFor("p", "scope", "saturate")
	created := int64(1<<48 - 1) // the last millisecond the head holds
	e.put(id, sizedRecord(fp, idem.Token{9}, math.MaxUint32-2, created, &resp))
	e.replay(id, fp, math.MaxUint32-1)
	e.replay(id, fp, math.MaxUint32)
	res := e.replay(id, fp, math.MaxUint32)
	e.replay(id, fp, math.MaxUint32)
	if res.CreatedAt.UnixMilli() != created {
		t.Fatalf("created %d, want %d", res.CreatedAt.UnixMilli(), created)
	}
	if got, want := e.raw(id), sizedRecord(fp, idem.Token{9}, math.MaxUint32, created, &resp); !bytes.Equal(got, want) {
		t.Fatalf("record\n%q\nwant\n%q", got, want)
	}
	if n := e.attempts(id); n != math.MaxUint32 {
		t.Fatalf("get: %d attempts", n)
	}
}

// TestOldLayoutRecordsStillCount: a record in the layout written before
// the compact head (decimal attempts and creation time, testdata)
// replays, counts its attempts in its own layout, and is still recognised
// as completed by its token.
func TestOldLayoutRecordsStillCount(t *testing.T) {
	e := newLayoutEnv(t)
	ctx := context.Background()
	g := goldenRecords[0] // completed-plain: written with token {1}, attempt 1
	old, err := os.ReadFile(g.file)
	if err != nil {
		t.Fatal(err)
	}
	if old[0] != 'c' || string(old[49:59]) != "0000000001" {
		t.Fatalf("%s is not a record of the decimal layout", g.file)
	}
	id := idem.RecordIDFor("p", "scope", "old")
	e.put(id, old)
	for n := 2; n <= 12; n++ {
		res := e.replay(id, goldenFP, n)
		if string(res.Response.Body) != string(g.resp.Body) {
			t.Fatalf("replay %d: %q", n, res.Response.Body)
		}
	}
	got := e.raw(id)
	want := string(old[:49]) + "0000000012" + string(old[59:])
	if string(got) != want {
		t.Fatalf("after 11 replays\n%q\nwant\n%q", got, want)
	}
	if n := e.attempts(id); n != 12 {
		t.Fatalf("get: %d attempts", n)
	}
	// complete by the token that stored it is a no-op; by another,
	// refused; so is a release.
	tok := idem.Token{1}
	if err := e.st.Complete(ctx, id, tok, idem.Response{Status: 500}, time.Hour); err != nil {
		t.Fatalf("complete by the storing token: %v", err)
	}
	if err := e.st.Complete(ctx, id, idem.Token{2}, idem.Response{Status: 500}, time.Hour); !errors.Is(err, idem.ErrNotHolder) {
		t.Fatalf("complete by another token: %v", err)
	}
	if err := e.st.Release(ctx, id, tok); !errors.Is(err, idem.ErrNotHolder) {
		t.Fatalf("release: %v", err)
	}
	if got := e.raw(id); string(got) != want {
		t.Fatalf("record changed\n%q\nwant\n%q", got, want)
	}
	// Another fingerprint is a mismatch, in either layout.
	res, err := e.st.Reserve(ctx, idem.Reservation{ID: id, Fingerprint: idem.Fingerprint{0xee}, Token: idem.NewToken(),
		Lease: time.Minute, Retention: time.Hour})
	if err != nil || res.Outcome != idem.Mismatch {
		t.Fatalf("other fingerprint: %v, %v", res.Outcome, err)
	}
}

// TestBinaryRecordsAreRecognisedByTheirToken: complete repeated by the
// token that stored a sized or compact record is a no-op, by another
// refused.
func TestBinaryRecordsAreRecognisedByTheirToken(t *testing.T) {
	e := newLayoutEnv(t)
	ctx := context.Background()
	fp := idem.Fingerprint{7}
	resp := idem.Response{Status: 200, Body: []byte("ok")}
	for _, l := range binaryLayouts {
		id := idem.RecordIDFor("p", "scope", "token-"+l.name)
		rec := l.record(fp, idem.Token{9}, 3, 1_700_000_000_123, &resp)
		e.put(id, rec)
		if err := e.st.Complete(ctx, id, idem.Token{9}, idem.Response{Status: 500}, time.Hour); err != nil {
			t.Fatalf("%s: complete by the storing token: %v", l.name, err)
		}
		if err := e.st.Complete(ctx, id, idem.Token{8}, idem.Response{Status: 500}, time.Hour); !errors.Is(err, idem.ErrNotHolder) {
			t.Fatalf("%s: complete by another token: %v", l.name, err)
		}
		if got := e.raw(id); !bytes.Equal(got, rec) {
			t.Fatalf("%s: record changed\n%q\nwant\n%q", l.name, got, rec)
		}
	}
}

// TestPeekReadsEveryLayout: when Redis refuses writes (maxmemory with
// noeviction), a replay is still answered from any layout (peek.lua), its
// attempt counted but not stored.
func TestPeekReadsEveryLayout(t *testing.T) {
	e := newLayoutEnv(t)
	ctx := context.Background()
	resp := idem.Response{Status: 200, Body: []byte("ok")}
	g := goldenRecords[0]
	old, err := os.ReadFile(g.file)
	if err != nil {
		t.Fatal(err)
	}
	records := []struct {
		name    string
		fp      idem.Fingerprint
		rec     []byte
		attempt int
	}{
		{"decimal", goldenFP, old, 2},
		{"sized", idem.Fingerprint{7}, sizedRecord(idem.Fingerprint{7}, idem.Token{9}, 41, 1_700_000_000_123, &resp), 42},
		{"compact", idem.Fingerprint{7}, compactRecord(idem.Fingerprint{7}, idem.Token{9}, 41, 1_700_000_000_123, &resp), 42},
		{"sized, saturated", idem.Fingerprint{7}, sizedRecord(idem.Fingerprint{7}, idem.Token{9}, math.MaxUint32, 1_700_000_000_123, &resp), math.MaxUint32},
	}
	for _, r := range records {
		e.put(idem.RecordIDFor("p", "scope", r.name), r.rec)
	}
	for _, c := range [][]any{{"CONFIG", "SET", "maxmemory-policy", "noeviction"}, {"CONFIG", "SET", "maxmemory", "1"}} {
		if err := e.srv.Do(ctx, c...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range records {
		id := idem.RecordIDFor("p", "scope", r.name)
		e.replay(id, r.fp, r.attempt)
		e.replay(id, r.fp, r.attempt) // not stored: counted again from the same
		if got := e.raw(id); !bytes.Equal(got, r.rec) {
			t.Fatalf("%s: record changed under noeviction\n%q\nwant\n%q", r.name, got, r.rec)
		}
	}
}

// TestSizedRecordCutOrGrownIsDamaged: a sized record cut at any length,
// inside its body too, or with bytes appended, is no record: reserve and
// peek answer damaged before they compare its fingerprint (record.lib,
// damaged_completed), and Get refuses it (completedHeadLen). So is a
// record whose first byte names a layout this build does not know, as a
// later build's would be during a rolling upgrade (docs/design.md §6.2).
func TestSizedRecordCutOrGrownIsDamaged(t *testing.T) {
	e := newLayoutEnv(t)
	ctx := context.Background()
	fp := idem.Fingerprint{7}
	resp := idem.Response{Status: 201, Headers: []idem.Header{{Name: "x-id", Value: "7"}}, Body: []byte("created")}
	whole := sizedRecord(fp, idem.Token{9}, 1, 1_700_000_000_123, &resp)
	var bad [][]byte
	for n := 1; n < len(whole); n++ {
		bad = append(bad, whole[:n])
	}
	for _, tail := range []string{"\x00", "x", string(whole)} {
		bad = append(bad, append(slices.Clone(whole), tail...))
	}
	for _, layout := range []byte{'f', 'a', 0} {
		bad = append(bad, append([]byte{layout}, whole[1:]...))
	}
	id := idem.RecordIDFor("p", "scope", "cut")
	for _, v := range append(bad, whole) {
		e.put(id, v)
		res, err := e.st.Reserve(ctx, idem.Reservation{ID: id, Fingerprint: fp, Token: idem.NewToken(),
			Lease: time.Minute, Retention: time.Hour})
		_, getErr := e.st.Get(ctx, id)
		peek, peekErr := e.srv.Client().Eval(ctx, scripts.Source("peek"), []string{e.st.Key(id)}, fp[:]).Slice()
		if peekErr != nil {
			t.Fatal(peekErr)
		}
		if bytes.Equal(v, whole) {
			if err != nil || res.Outcome != idem.Completed || getErr != nil || peek[0] != "completed" {
				t.Fatalf("whole record: reserve %v %v, get %v, peek %v", res.Outcome, err, getErr, peek[0])
			}
			continue
		}
		if !errors.Is(err, idem.ErrDamaged) || !errors.Is(getErr, idem.ErrDamaged) || peek[0] != "damaged" {
			t.Fatalf("%d of %d bytes: reserve %v %v, get %v, peek %v", len(v), len(whole), res.Outcome, err, getErr, peek[0])
		}
	}
}
