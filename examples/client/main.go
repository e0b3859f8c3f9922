// Command client creates one order through an idem-extproc protected route
// with idemclient, the way a service should call a write: one operation key
// for every attempt, one overall deadline, and a stop where the contract
// says the caller must look before it acts again.
//
//	go run ./examples/client -url http://localhost:8080/orders -body '{"item":"book"}'
//
// Run it twice with the same -key to see the replay; change -body with the
// same -key to see idempotency-key-reused.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/idem-extproc/idem-extproc/idemclient"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "client:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("client", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("url", "http://localhost:8080/orders", "the protected route")
	body := fs.String("body", `{"item":"book","amount":100}`, "the order to create")
	key := fs.String("key", "", "the operation key (a new UUIDv7 when empty)")
	deadline := fs.Duration("deadline", 45*time.Second, "one deadline for the whole chain of attempts")
	// 15 s: longer than what Envoy may spend on one protected request
	// (docs/envoy.md, "The route-timeout rule"), so that Envoy, not the client,
	// sees how a slow attempt ended.
	perAttempt := fs.Duration("attempt-timeout", 15*time.Second, "the longest one attempt may wait for its response headers")
	if err := fs.Parse(args); err != nil {
		return err
	}

	client := idemclient.NewClient(idemclient.Options{
		MaxAttempts:    5,
		AttemptTimeout: *perAttempt,
		Logger:         slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	ctx, cancel := context.WithTimeout(ctx, *deadline)
	defer cancel()

	// One operation, one key: every retry inside client.Do reuses it, and
	// so must a caller that asks again about this same order later.
	req, err := idemclient.NewRequest(ctx, http.MethodPost, *url, []byte(*body))
	if err != nil {
		return err
	}
	if *key != "" {
		if err := idemclient.SetKey(req, *key); err != nil {
			return err
		}
	}
	req.Header.Set("Content-Type", "application/json")
	fmt.Fprintf(stdout, "operation key %s\n", idemclient.Key(req))

	resp, err := client.Do(req)
	switch {
	case errors.Is(err, idemclient.ErrOutcomeUnknown):
		// The article's negative path: the order may or may not exist.
		// Read it (by a business id the body carries) before deciding; if
		// it does not exist, create it again under a NEW key.
		return fmt.Errorf("outcome unknown: check the order before creating it again with a new key: %w", err)
	case errors.Is(err, idemclient.ErrKeyReused):
		return fmt.Errorf("this key already named a different order; use a new key for a new order: %w", err)
	case err != nil:
		return err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	replay := ""
	if idemclient.Replayed(resp) {
		replay = " (replayed: an earlier attempt or call already created it)"
	}
	fmt.Fprintf(stdout, "%d after %d attempt(s)%s\n%s\n", resp.StatusCode, idemclient.Attempts(resp), replay, bytes.TrimSpace(out))
	if resp.StatusCode >= 300 {
		return fmt.Errorf("the order was not created: %s", resp.Status)
	}
	return nil
}
