package idemclient_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/idem-extproc/idem-extproc/idemclient"
)

func Example() {
	// A stand-in for a protected route: busy once, then created.
	busy := true
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if busy {
			busy = false
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()

	client := idemclient.NewClient(idemclient.Options{MaxAttempts: 4, BaseDelay: time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // the whole chain
	defer cancel()
	req, _ := idemclient.NewRequest(ctx, http.MethodPost, srv.URL+"/orders", []byte(`{"item":"book"}`))
	resp, err := client.Do(req)
	switch {
	case errors.Is(err, idemclient.ErrOutcomeUnknown):
		fmt.Println("check the order before creating it again with a new key")
	case err != nil:
		fmt.Println("failed:", err)
	default:
		resp.Body.Close()
		fmt.Println(resp.StatusCode, "after", idemclient.Attempts(resp), "attempts, replayed:", idemclient.Replayed(resp))
	}
	// Output: 201 after 2 attempts, replayed: false
}
