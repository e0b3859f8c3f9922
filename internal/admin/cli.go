package admin

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
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

	"github.com/idem-extproc/idem-extproc/internal/idem"
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
	fs.StringVar(&f.scope, "scope", "", "the key's scope as the server read it (the scope field of its logs). With scope.from: authority\n"+
		"(the default) the request's :authority as Envoy sent it, port included when it has one\n"+
		"(api.example.com, api.example.com:8443, localhost:8080); \"\" with scope.from: none")
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
	cmd, fs, f, code, ok := parseCLI(args, getenv, stderr)
	if !ok {
		return code
	}
	if err := checkCLI(cmd, fs, f); err != nil {
		fmt.Fprintf(stderr, "idem-extproc admin %s: %s\n", cmd, err)
		return 2
	}
	method, path, payload, err := requestFor(cmd, f)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	return send(ctx, cmd, f, method, path, payload, stdout, stderr)
}

// cliUsage prints the one-line usage of `idem-extproc admin`.
func cliUsage(stderr io.Writer) {
	fmt.Fprintln(stderr, "usage: idem-extproc admin get|purge|resolve|adoption [flags]  (idem-extproc admin get -h for flags)")
}

// parseCLI picks the subcommand out of args and parses its flags. When ok
// is false the command is over, with exit code code: help was asked for
// (0) or the command line is wrong (2, said on stderr).
func parseCLI(args []string, getenv func(string) string, stderr io.Writer) (cmd string, fs *flag.FlagSet, f *cliFlags, code int, ok bool) {
	if len(args) == 0 {
		cliUsage(stderr)
		return "", nil, nil, 2, false
	}
	cmd = args[0]
	switch cmd {
	case "-h", "-help", "--help", "help":
		cliUsage(stderr) // asked for: not an error
		return cmd, nil, nil, 0, false
	case "get", "purge", "resolve", "adoption":
	default:
		// Checked before the flags: otherwise a misspelt subcommand is
		// reported as whichever of its flags the others lack.
		fmt.Fprintf(stderr, "idem-extproc admin: unknown subcommand %q\n", cmd)
		cliUsage(stderr)
		return cmd, nil, nil, 2, false
	}
	fs, f = defineFlags(cmd, getenv)
	fs.SetOutput(stderr)
	if err := fs.Parse(args[1:]); errors.Is(err, flag.ErrHelp) {
		return cmd, fs, f, 0, false // the flags were printed, as asked
	} else if err != nil {
		return cmd, fs, f, 2, false
	}
	return cmd, fs, f, 0, true
}

// checkCLI refuses parsed flags that cannot make a request; RunCLI prints
// the error after the subcommand's name.
func checkCLI(cmd string, fs *flag.FlagSet, f *cliFlags) error {
	// Parsing stops at the first word that is not a flag, and would
	// silently drop every flag after it: `resolve release --id …` would
	// then fail on something it never said.
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q: every option is a flag (--action release, --id …)", fs.Arg(0))
	}
	if cmd != "adoption" {
		if err := checkRecordName(fs, f); err != nil {
			return err
		}
	}
	if cmd == "resolve" {
		if err := checkResolve(fs, f.action, f.status); err != nil {
			return err
		}
	}
	if f.tokenFile == "" {
		return errors.New("no bearer token: set --token-file or IDEM_ADMIN_TOKEN_FILE")
	}
	return nil
}

// checkRecordName refuses a record command that names no record, or names
// one in a way the server refuses with 400 (admin.target): those are
// mistakes in the command line, not refusals.
func checkRecordName(fs *flag.FlagSet, f *cliFlags) error {
	given := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { given[fl.Name] = true })
	if given["id"] {
		if given["scope"] || given["key"] {
			return errors.New("name the record by --id, or by --policy, --scope and --key, not both")
		}
		if b, err := hex.DecodeString(f.id); err != nil || len(b) != 16 {
			return fmt.Errorf("--id %q: want the 32-hex-digit key_hash of the server's logs", f.id)
		}
		return nil
	}
	var missing []string
	for _, name := range []string{"policy", "scope", "key"} {
		if !given[name] {
			missing = append(missing, "--"+name)
		}
	}
	switch {
	case len(missing) == 3:
		return errors.New("name the record: --id (the key_hash of the server's logs), or --policy, --scope and --key")
	case len(missing) > 0:
		return fmt.Errorf("name the record by --policy, --scope and --key: missing %s", strings.Join(missing, " and "))
	}
	if _, err := idem.ParseKey(f.key, 0); err != nil {
		return fmt.Errorf("--key: %w", err)
	}
	return nil
}

// requestFor gives the method, path under Prefix and JSON payload of cmd's
// request. Its only error is an unreadable --body-file, already named.
func requestFor(cmd string, f *cliFlags) (method, path string, payload []byte, err error) {
	switch cmd {
	case "get":
		method, path = http.MethodGet, "records"
	case "purge":
		method, path = http.MethodDelete, "records"
	case "adoption":
		method, path = http.MethodGet, "adoption"
	case "resolve":
		method, path = http.MethodPost, "records/resolve"
		req := resolveRequest{Action: f.action, Status: f.status, Headers: f.headers}
		if f.bodyFile != "" {
			b, err := os.ReadFile(f.bodyFile)
			if err != nil {
				return "", "", nil, fmt.Errorf("--body-file: %w", err)
			}
			req.BodyBase64 = base64.StdEncoding.EncodeToString(b)
		} else {
			req.Body = f.body
		}
		payload, _ = json.Marshal(req)
	}
	return method, path, payload, nil
}

// send makes the request with the bearer token of --token-file, copies a
// success's body to stdout and reports a refusal on stderr; it returns
// the exit code.
func send(ctx context.Context, cmd string, f *cliFlags, method, path string, payload []byte, stdout, stderr io.Writer) int {
	token, err := ReadToken(f.tokenFile)
	if err != nil {
		fmt.Fprintln(stderr, "--token-file:", err)
		return 2
	}
	q := url.Values{}
	for name, v := range map[string]string{"id": f.id, "policy": f.policy, "key": f.key} {
		if v != "" {
			q.Set(name, v)
		}
	}
	if f.id == "" && cmd != "adoption" {
		// Even empty: the scope of a scope.from: none policy is "".
		q.Set("scope", f.scope)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(f.addr, "/")+Prefix+path+"?"+q.Encode(), bytes.NewReader(payload))
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		reportRefusal(cmd, resp, stderr)
		return 1
	}
	_, _ = io.Copy(stdout, resp.Body)
	return 0
}

// reportRefusal says on stderr why the server refused. The refusal goes
// where errors go, with the server's reason, so that stdout holds only a
// result a script can parse.
func reportRefusal(cmd string, resp *http.Response, stderr io.Writer) {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var e struct {
		Error string `json:"error"`
	}
	reason := strings.TrimSpace(string(b))
	if json.Unmarshal(b, &e) == nil && e.Error != "" {
		reason = e.Error
	}
	fmt.Fprintf(stderr, "idem-extproc admin %s: %s: %s\n", cmd, resp.Status, reason)
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
