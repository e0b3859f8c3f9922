package admin

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// headerFlags collects repeated --header name:value flags.
type headerFlags [][2]string

func (h *headerFlags) String() string { return fmt.Sprint(*h) }

func (h *headerFlags) Set(v string) error {
	name, value, ok := strings.Cut(v, ":")
	if !ok || strings.TrimSpace(name) == "" {
		return errors.New("want name:value")
	}
	*h = append(*h, [2]string{strings.TrimSpace(name), strings.TrimSpace(value)})
	return nil
}

// RunCLI runs `idem-extproc admin <get|purge|resolve> [flags]` against a
// running server's admin API and returns the exit code.
func RunCLI(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	usage := func() {
		fmt.Fprintln(stderr, "usage: idem-extproc admin get|purge|resolve [flags]  (idem-extproc admin get -h for flags)")
	}
	if len(args) == 0 {
		usage()
		return 2
	}
	cmd := args[0]
	fs := flag.NewFlagSet("idem-extproc admin "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", envOr(getenv, "IDEM_ADMIN_ADDR", "http://127.0.0.1:8081"), "admin address of the server (env IDEM_ADMIN_ADDR)")
	tokenFile := fs.String("token-file", getenv("IDEM_ADMIN_TOKEN_FILE"), "file holding the bearer token (env IDEM_ADMIN_TOKEN_FILE)")
	id := fs.String("id", "", "record id: the key_hash of the server's logs")
	pol := fs.String("policy", "", "policy name (with --scope and --key, or with --id for resolve's retention)")
	scope := fs.String("scope", "", "the key's scope (for the default policy: the request's host)")
	key := fs.String("key", "", "the Idempotency-Key as the client sent it")
	var action, body, bodyFile string
	var status int
	var headers headerFlags
	if cmd == "resolve" {
		fs.StringVar(&action, "action", "", "release (the next attempt runs) or complete (store the given response)")
		fs.IntVar(&status, "status", 0, "complete: the response status")
		fs.Var(&headers, "header", "complete: a response header name:value (repeatable)")
		fs.StringVar(&body, "body", "", "complete: the response body")
		fs.StringVar(&bodyFile, "body-file", "", "complete: read the response body from this file")
	}
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	var method, path string
	var payload []byte
	switch cmd {
	case "get":
		method, path = http.MethodGet, "records"
	case "purge":
		method, path = http.MethodDelete, "records"
	case "resolve":
		method, path = http.MethodPost, "records/resolve"
		req := resolveRequest{Action: action, Status: status, Headers: headers}
		if bodyFile != "" {
			b, err := os.ReadFile(bodyFile)
			if err != nil {
				fmt.Fprintln(stderr, "--body-file:", err)
				return 2
			}
			req.BodyBase64 = base64.StdEncoding.EncodeToString(b)
		} else {
			req.Body = body
		}
		payload, _ = json.Marshal(req)
	default:
		usage()
		return 2
	}
	token, err := os.ReadFile(*tokenFile)
	if err != nil {
		fmt.Fprintln(stderr, "--token-file:", err)
		return 2
	}
	q := url.Values{}
	for name, v := range map[string]string{"id": *id, "policy": *pol, "scope": *scope, "key": *key} {
		if v != "" {
			q.Set(name, v)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(*addr, "/")+Prefix+path+"?"+q.Encode(), bytes.NewReader(payload))
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	defer resp.Body.Close()
	_, _ = io.Copy(stdout, resp.Body)
	if resp.StatusCode >= 300 {
		return 1
	}
	return 0
}

func envOr(getenv func(string) string, name, def string) string {
	if v := getenv(name); v != "" {
		return v
	}
	return def
}
