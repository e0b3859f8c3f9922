package demoorders

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func post(t *testing.T, h http.Handler, target, body string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, target, strings.NewReader(body))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func TestCreateCountsEveryExecutedWrite(t *testing.T) {
	s := &Server{}
	h := s.Handler()
	for i := 1; i <= 2; i++ {
		rec := post(t, h, "/orders", `{"item":"book"}`)
		if rec.Code != http.StatusCreated {
			t.Fatalf("POST #%d: %d %s", i, rec.Code, rec.Body)
		}
		var o Order
		if err := json.Unmarshal(rec.Body.Bytes(), &o); err != nil {
			t.Fatal(err)
		}
		if o.Number != i || rec.Header().Get("Location") != "/orders/"+o.ID || string(o.Request) != `{"item":"book"}` {
			t.Errorf("POST #%d: got %+v, Location %q", i, o, rec.Header().Get("Location"))
		}
		get := httptest.NewRecorder()
		h.ServeHTTP(get, httptest.NewRequest(http.MethodGet, "/orders/"+o.ID, nil))
		if get.Code != http.StatusOK {
			t.Errorf("GET %s: %d", o.ID, get.Code)
		}
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/orders/count", nil))
	if got := strings.TrimSpace(rec.Body.String()); got != `{"orders_created":2}` {
		t.Errorf("count: %s", got)
	}
}

func TestCreateRejectsBadInput(t *testing.T) {
	s := &Server{MaxDelay: time.Second}
	h := s.Handler()
	for _, c := range []struct{ target, body string }{
		{"/orders", "not json"},
		{"/orders?delay=2s", "{}"},
		{"/orders?delay=-1s", "{}"},
		{"/orders?delay=soon", "{}"},
	} {
		if rec := post(t, h, c.target, c.body); rec.Code != http.StatusBadRequest {
			t.Errorf("POST %s %q: %d, want 400", c.target, c.body, rec.Code)
		}
	}
	if rec := post(t, h, "/orders", `"`+strings.Repeat("x", maxBody)+`"`); rec.Code != http.StatusRequestEntityTooLarge {
		t.Errorf("large body: %d, want 413", rec.Code)
	}
	if s.Count() != 0 {
		t.Errorf("rejected requests created %d orders", s.Count())
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/orders/ord_999999", nil))
	if rec.Code != http.StatusNotFound {
		t.Errorf("unknown order: %d", rec.Code)
	}
}

// TestDelayedCreateHappensEvenIfCallerLeft shows the hazard the demo is
// for: the caller gave up (as Envoy does at its route timeout), the order
// was created all the same.
func TestDelayedCreateHappensEvenIfCallerLeft(t *testing.T) {
	s := &Server{}
	ctx, cancel := context.WithCancel(context.Background())
	req := httptest.NewRequest(http.MethodPost, "/orders?delay=50ms", strings.NewReader("{}")).WithContext(ctx)
	cancel()
	start := time.Now()
	s.Handler().ServeHTTP(httptest.NewRecorder(), req)
	if time.Since(start) < 50*time.Millisecond {
		t.Errorf("answered after %v, before the delay", time.Since(start))
	}
	if s.Count() != 1 {
		t.Errorf("count %d, want 1", s.Count())
	}
}

// TestDropCreatesAndLeavesUnanswered: ?drop creates the order and closes
// the connection with no response, so the caller sees a transport error.
func TestDropCreatesAndLeavesUnanswered(t *testing.T) {
	s := &Server{}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/orders?drop", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := srv.Client().Do(req)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("got %d, want the connection closed unanswered", resp.StatusCode)
	}
	if s.Count() != 1 {
		t.Errorf("count %d, want 1", s.Count())
	}
}
