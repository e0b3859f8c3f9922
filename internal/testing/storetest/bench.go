package storetest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// benchBatch is how many records a benchmark prepares (or cleans up) at
// once with its timer stopped, so that setup costs one timer stop per
// batch rather than one per operation, and the store stays small however
// large b.N grows.
const benchBatch = 1024

// BenchResponse is the response the store benchmarks complete records
// with: a typical JSON answer with a 1 KiB body.
func BenchResponse() idem.Response {
	return idem.Response{
		Status: 201,
		Headers: []idem.Header{
			{Name: "content-type", Value: "application/json"},
			{Name: "location", Value: "/orders/0123456789"},
			{Name: "x-request-id", Value: "5f0c6f1e-8a53-4d3a-9d2f-2b1d3c4e5f60"},
		},
		Body: []byte(`{"id":"0123456789","status":"created","items":"` + strings.Repeat("x", 1024-48) + `"}`),
	}
}

func benchReservation(id idem.RecordID, tok idem.Token) idem.Reservation {
	return idem.Reservation{ID: id, Fingerprint: fpA, Token: tok, Lease: time.Minute, Retention: time.Hour}
}

// Benchmark measures every store operation on s, one sub-benchmark each,
// as the server calls them: reserve (a new key), reserve of a completed
// key (a replay, which returns the stored response), complete with
// BenchResponse, renew, release, mark_unknown and get. Records are
// prepared in batches with the timer stopped and removed afterwards.
func Benchmark(b *testing.B, s idem.Store) {
	ctx := context.Background()
	var seq int
	ids := func(n int) []idem.RecordID {
		out := make([]idem.RecordID, n)
		for i := range out {
			seq++
			out[i] = idem.RecordIDFor("bench", "scope", fmt.Sprintf("key-%d-%d", time.Now().UnixNano(), seq))
		}
		return out
	}
	must := func(err error) {
		if err != nil {
			b.Fatal(err)
		}
	}
	reserve := func(id idem.RecordID, tok idem.Token) {
		res, err := s.Reserve(ctx, benchReservation(id, tok))
		must(err)
		if res.Outcome != idem.Reserved {
			b.Fatalf("Reserve = %v, want reserved", res.Outcome)
		}
	}
	// drop removes a batch's records, whatever their state, so that the
	// store does not grow with b.N.
	drop := func(batch []idem.RecordID, tok idem.Token) {
		a, admin := s.(idem.Admin)
		for _, id := range batch {
			if admin {
				_ = a.Purge(ctx, id)
			} else {
				_ = s.Release(ctx, id, tok)
			}
		}
	}
	// held runs op on b.N records reserved beforehand, batch by batch.
	held := func(b *testing.B, op func(id idem.RecordID, tok idem.Token) error) {
		tok := idem.NewToken()
		for done := 0; done < b.N; {
			b.StopTimer()
			batch := ids(min(benchBatch, b.N-done))
			for _, id := range batch {
				reserve(id, tok)
			}
			b.StartTimer()
			for _, id := range batch {
				must(op(id, tok))
			}
			b.StopTimer()
			drop(batch, tok)
			b.StartTimer()
			done += len(batch)
		}
	}
	resp := BenchResponse()

	b.Run("reserve", func(b *testing.B) {
		b.ReportAllocs()
		tok := idem.NewToken()
		for done := 0; done < b.N; {
			b.StopTimer()
			batch := ids(min(benchBatch, b.N-done))
			b.StartTimer()
			for _, id := range batch {
				reserve(id, tok)
			}
			b.StopTimer()
			drop(batch, tok)
			b.StartTimer()
			done += len(batch)
		}
	})
	b.Run("reserve_completed", func(b *testing.B) {
		b.ReportAllocs()
		id, tok := ids(1)[0], idem.NewToken()
		reserve(id, tok)
		must(s.Complete(ctx, id, tok, resp, time.Hour))
		b.ResetTimer()
		for range b.N {
			res, err := s.Reserve(ctx, benchReservation(id, idem.NewToken()))
			must(err)
			if res.Outcome != idem.Completed || len(res.Response.Body) != len(resp.Body) {
				b.Fatalf("Reserve = %v, want the completed response", res.Outcome)
			}
		}
	})
	b.Run("complete", func(b *testing.B) {
		b.ReportAllocs()
		held(b, func(id idem.RecordID, tok idem.Token) error { return s.Complete(ctx, id, tok, resp, time.Hour) })
	})
	b.Run("renew", func(b *testing.B) {
		b.ReportAllocs()
		held(b, func(id idem.RecordID, tok idem.Token) error { return s.Renew(ctx, id, tok, time.Minute) })
	})
	b.Run("release", func(b *testing.B) {
		b.ReportAllocs()
		held(b, func(id idem.RecordID, tok idem.Token) error { return s.Release(ctx, id, tok) })
	})
	b.Run("mark_unknown", func(b *testing.B) {
		b.ReportAllocs()
		held(b, func(id idem.RecordID, tok idem.Token) error { return s.MarkUnknown(ctx, id, tok, time.Hour) })
	})
	b.Run("get", func(b *testing.B) {
		b.ReportAllocs()
		id, tok := ids(1)[0], idem.NewToken()
		reserve(id, tok)
		must(s.Complete(ctx, id, tok, resp, time.Hour))
		b.ResetTimer()
		for range b.N {
			rec, err := s.Get(ctx, id)
			must(err)
			if rec.State != idem.StateCompleted {
				b.Fatalf("Get = %v, want completed", rec.State)
			}
		}
	})
}
