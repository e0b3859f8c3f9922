// Package demoorders is a tiny orders API with a visible side effect: the
// upstream of the docker-compose quickstart. Every POST /orders that
// reaches it creates an order and bumps a counter shown by
// GET /orders/count, so one can see that a replayed request never reached
// it. A ?delay= on the POST holds the answer back, long enough to send a
// concurrent retry (409) or to outlast Envoy's route timeout; the order is
// created after the delay even if the caller has gone, as a real backend
// that does not notice a vanished client would. A ?drop on the POST creates
// the order and closes the connection without answering, as a backend that
// crashed after its commit: whoever sent it cannot tell whether it ran.
package demoorders

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"
)

// Defaults of the demo server.
const (
	DefaultAddr     = ":8080"
	DefaultMaxDelay = 30 * time.Second
	maxBody         = 64 << 10
)

// Order is one created order.
type Order struct {
	ID string `json:"id"`
	// Number counts orders from 1: the side effect made visible.
	Number    int             `json:"number"`
	Request   json.RawMessage `json:"request"`
	CreatedAt time.Time       `json:"created_at"`
}

// Server holds the orders in memory.
type Server struct {
	// MaxDelay bounds ?delay=; DefaultMaxDelay when zero.
	MaxDelay time.Duration
	// Log receives one line per created order; none when nil.
	Log *slog.Logger

	mu     sync.Mutex
	orders map[string]Order
	count  int
}

// Handler serves the API:
//
//	POST /orders[?delay=2s]  create an order from a JSON body: 201
//	POST /orders?drop        create it, then close the connection unanswered
//	GET  /orders/count       {"orders_created": n}
//	GET  /orders/{id}        one order, or 404
//	GET  /healthz            ok
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", s.create)
	mux.HandleFunc("GET /orders/count", s.countOrders)
	mux.HandleFunc("GET /orders/{id}", s.get)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	return mux
}

// Count returns how many orders were created.
func (s *Server) Count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.count
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	var delay time.Duration
	if d := r.URL.Query().Get("delay"); d != "" {
		var err error
		delay, err = time.ParseDuration(d)
		if err != nil || delay < 0 || delay > s.maxDelay() {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("delay must be a duration between 0s and %v", s.maxDelay()))
			return
		}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		writeError(w, http.StatusRequestEntityTooLarge, "body too large")
		return
	}
	if !json.Valid(body) {
		writeError(w, http.StatusBadRequest, "body must be JSON")
		return
	}
	// Not tied to the request's context: the effect happens whether or
	// not the caller is still there to hear about it.
	time.Sleep(delay)

	s.mu.Lock()
	if s.orders == nil {
		s.orders = map[string]Order{}
	}
	s.count++
	o := Order{ID: fmt.Sprintf("ord_%06d", s.count), Number: s.count, Request: body, CreatedAt: time.Now().UTC()}
	s.orders[o.ID] = o
	s.mu.Unlock()

	if s.Log != nil {
		s.Log.Info("order created", slog.String("id", o.ID), slog.Int("number", o.Number),
			slog.String("idempotency_key", r.Header.Get("Idempotency-Key")))
	}
	if r.URL.Query().Has("drop") {
		// Nothing written yet: the server closes the connection with no
		// response, and logs no stack (net/http, ErrAbortHandler).
		panic(http.ErrAbortHandler)
	}
	w.Header().Set("Location", "/orders/"+o.ID)
	writeJSON(w, http.StatusCreated, o)
}

func (s *Server) countOrders(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]int{"orders_created": s.Count()})
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	o, ok := s.orders[r.PathValue("id")]
	s.mu.Unlock()
	if !ok {
		writeError(w, http.StatusNotFound, "no such order")
		return
	}
	writeJSON(w, http.StatusOK, o)
}

func (s *Server) maxDelay() time.Duration {
	if s.MaxDelay > 0 {
		return s.MaxDelay
	}
	return DefaultMaxDelay
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}
