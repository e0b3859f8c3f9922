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

// Subcommands are the subcommands of `idem-extproc admin`.
var Subcommands = []string{"get", "purge", "resolve", "adoption"}

// cliFlags holds the values of one subcommand's flags.
type cliFlags struct {
	addr, tokenFile, id, policy, scope, key string
	action, body, bodyFile                  string
	status                                  int
	headers                                 headerFlags
}

// Flags returns the flags of `idem-extproc admin <cmd>`, as RunCLI defines
// them, for the command line's help and shell completion.
func Flags(cmd string, getenv func(string) string) *flag.FlagSet {
	fs, _ := defineFlags(cmd, getenv)
	return fs
}

// defineFlags defines cmd's flags on a new flag set bound to the returned
// values; the environment gives the defaults of the address and token.
func defineFlags(cmd string, getenv func(string) string) (*flag.FlagSet, *cliFlags) {
	f := &cliFlags{}
	fs := flag.NewFlagSet("idem-extproc admin "+cmd, flag.ContinueOnError)
	fs.StringVar(&f.addr, "addr", envOr(getenv, "IDEM_ADMIN_ADDR", "http://127.0.0.1:8081"), "admin address of the server (env IDEM_ADMIN_ADDR)")
	fs.StringVar(&f.tokenFile, "token-file", getenv("IDEM_ADMIN_TOKEN_FILE"), "file holding the bearer token (env IDEM_ADMIN_TOKEN_FILE)")
	if cmd == "adoption" {
		return fs, f // the report covers every policy: no record to name
	}
	fs.StringVar(&f.id, "id", "", "record id: the key_hash of the server's logs")
	fs.StringVar(&f.policy, "policy", "", "policy name (with --scope and --key, or with --id for resolve's retention)")
	fs.StringVar(&f.scope, "scope", "", "the key's scope (for the default policy: the request's host)")
	fs.StringVar(&f.key, "key", "", "the Idempotency-Key as the client sent it")
	if cmd == "resolve" {
		fs.StringVar(&f.action, "action", "", "release (the next attempt runs) or complete (store the given response)")
		fs.IntVar(&f.status, "status", 0, "complete: the response status")
		fs.Var(&f.headers, "header", "complete: a response header name:value (repeatable)")
		fs.StringVar(&f.body, "body", "", "complete: the response body")
		fs.StringVar(&f.bodyFile, "body-file", "", "complete: read the response body from this file")
	}
	return fs, f
}

// RunCLI runs `idem-extproc admin <get|purge|resolve|adoption> [flags]`
// against a running server's admin API and returns the exit code.
func RunCLI(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	usage := func() {
		fmt.Fprintln(stderr, "usage: idem-extproc admin get|purge|resolve|adoption [flags]  (idem-extproc admin get -h for flags)")
	}
	if len(args) == 0 {
		usage()
		return 2
	}
	cmd := args[0]
	switch cmd {
	case "-h", "-help", "--help", "help":
		usage() // asked for: not an error
		return 0
	case "get", "purge", "resolve", "adoption":
	default:
		// Checked before the flags: otherwise a misspelt subcommand is
		// reported as whichever of its flags the others lack.
		fmt.Fprintf(stderr, "idem-extproc admin: unknown subcommand %q\n", cmd)
		usage()
		return 2
	}
	fs, f := defineFlags(cmd, getenv)
	fs.SetOutput(stderr)
	if err := fs.Parse(args[1:]); errors.Is(err, flag.ErrHelp) {
		return 0 // the flags were printed, as asked
	} else if err != nil {
		return 2
	}
	addr, tokenFile, id, pol, scope, key := &f.addr, &f.tokenFile, &f.id, &f.policy, &f.scope, &f.key
	action, status, headers, body, bodyFile := f.action, f.status, f.headers, f.body, f.bodyFile
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "idem-extproc admin %s: %s\n", cmd, fmt.Sprintf(format, a...))
		return 2
	}
	// Parsing stops at the first word that is not a flag, and would
	// silently drop every flag after it: `resolve release --id …` would
	// then fail on something it never said.
	if fs.NArg() > 0 {
		return fail("unexpected argument %q: every option is a flag (--action release, --id …)", fs.Arg(0))
	}
	if cmd == "resolve" {
		if err := checkResolve(fs, action, status); err != nil {
			return fail("%v", err)
		}
	}
	if *tokenFile == "" {
		return fail("no bearer token: set --token-file or IDEM_ADMIN_TOKEN_FILE")
	}
	var method, path string
	var payload []byte
	switch cmd {
	case "get":
		method, path = http.MethodGet, "records"
	case "purge":
		method, path = http.MethodDelete, "records"
	case "adoption":
		method, path = http.MethodGet, "adoption"
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
	if resp.StatusCode >= 300 {
		// The refusal goes where errors go, with the server's reason, so
		// that stdout holds only a result a script can parse.
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		var e struct {
			Error string `json:"error"`
		}
		reason := strings.TrimSpace(string(b))
		if json.Unmarshal(b, &e) == nil && e.Error != "" {
			reason = e.Error
		}
		fmt.Fprintf(stderr, "idem-extproc admin %s: %s: %s\n", cmd, resp.Status, reason)
		return 1
	}
	_, _ = io.Copy(stdout, resp.Body)
	return 0
}

// checkResolve refuses a resolve the server would refuse, and one it
// would take for something else: a response given with --action release
// would be dropped and the operation run again, the very duplicate the
// operator meant to prevent.
func checkResolve(fs *flag.FlagSet, action string, status int) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	switch action {
	case "release":
		for _, name := range []string{"status", "header", "body", "body-file"} {
			if given[name] {
				return fmt.Errorf("--%s is for --action complete; --action release stores no response", name)
			}
		}
	case "complete":
		if status < 100 || status > 599 {
			return errors.New("--action complete needs --status, from 100 to 599")
		}
		if given["body"] && given["body-file"] {
			return errors.New("give --body or --body-file, not both")
		}
	case "":
		return errors.New("--action is required: release (the next attempt runs the operation) or complete (retries replay the given response)")
	default:
		return fmt.Errorf("--action %q: want release or complete", action)
	}
	return nil
}

func envOr(getenv func(string) string, name, def string) string {
	if v := getenv(name); v != "" {
		return v
	}
	return def
}
