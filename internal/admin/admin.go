// Package admin is the operator's HTTP API on the admin port: look up a
// record, purge it, and resolve an unknown one after checking the domain by
// hand. It is off unless a bearer token file is configured, and every
// action is logged.
package admin

import (
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/rotated"
	"github.com/idem-extproc/idem-extproc/internal/safefile"
)

// Store is what the API needs of a store.
type Store interface {
	idem.Store
	idem.Admin
}

// Config configures the API.
type Config struct {
	Store Store
	// Policies gives the policies in force, to find a record's retention.
	Policies func() *policy.Set
	// TokenFile holds the bearer token. It is read when the handler is
	// made and again when the file changes (a rotated Kubernetes secret),
	// not on every request.
	TokenFile string
	Logger    *slog.Logger
	// OnAction, when set, is told every action and its result.
	OnAction func(action, result string)
	// Now is the clock for ages; time.Now when nil.
	Now func() time.Time
	// Sealer, when set, seals responses supplied to resolve for policies
	// with encrypt (and whenever the policy is not named).
	Sealer idem.Sealer
	// Counters, when set, serves GET /admin/v1/adoption from them.
	Counters Counters
}

// Prefix is where the API is mounted.
const Prefix = "/admin/v1/"

// Handler returns the API's handler for paths under Prefix.
func Handler(cfg Config) http.Handler {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	a := &api{cfg: cfg}
	a.token = a.loadToken()
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+Prefix+"records", a.onRecord(a.get))
	mux.HandleFunc("DELETE "+Prefix+"records", a.onRecord(a.purge))
	mux.HandleFunc("POST "+Prefix+"records/resolve", a.onRecord(a.resolve))
	if cfg.Counters != nil {
		mux.HandleFunc("GET "+Prefix+"adoption", a.adoption)
	}
	return a.authenticate(mux)
}

type api struct {
	cfg Config
	// token is the bearer token in force; "" while its file has not been
	// read since the handler was made.
	token *rotated.Value[string]
}

// tokenCheckEvery bounds how often a request looks at the token file's
// modification time.
const tokenCheckEvery = time.Second

// maxTokenFile caps the token file: a bearer token is a line.
const maxTokenFile = 16 << 10

// loadToken reads the token file, to be read again only when it changes
// (package rotated): a request neither pays for a read nor waits on a file
// that blocks. A changed file that does not load (empty, too big, not a
// regular file) keeps the previous token, logged and counted as the
// action token_reload, result rejected. A file that cannot be read as the
// handler is made (the daemon checked it just before) leaves no token, and
// every request refused, until it changes.
func (a *api) loadToken() *rotated.Value[string] {
	path := a.cfg.TokenFile
	first := true
	load := func() (string, error) {
		token, err := ReadToken(path)
		if first && err != nil {
			a.cfg.Logger.Error("admin API: token file unreadable or empty; refusing every request until it changes",
				slog.String("error", err.Error()))
			err = nil
		}
		first = false
		return token, err
	}
	v, _ := rotated.Load([]string{path}, load, rotated.Options[string]{
		Every: tokenCheckEvery,
		OnReload: func(_ string, err error) {
			if err != nil {
				a.cfg.Logger.Error("admin API: token file changed but does not load; keeping the previous token",
					slog.String("error", err.Error()))
				a.record("token_reload", "rejected")
				return
			}
			a.cfg.Logger.Info("admin API: token reloaded", slog.String("file", path))
			a.record("token_reload", "ok")
		},
	})
	return v
}

func (a *api) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token := a.token.Current()
		if token == "" {
			writeError(w, http.StatusServiceUnavailable, "the admin token is not available")
			return
		}
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
			a.cfg.Logger.Warn("admin API: request refused", slog.String("method", r.Method), slog.String("path", r.URL.Path),
				slog.String("remote", r.RemoteAddr))
			a.record("auth", "refused")
			w.Header().Set("WWW-Authenticate", `Bearer realm="idem-extproc admin"`)
			writeError(w, http.StatusUnauthorized, "a valid bearer token is required")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// ReadToken reads the bearer token from its file (surrounding white space
// dropped), a regular file of at most 16 KiB. The daemon checks it once
// at start, so that a wrong path stops the start instead of turning every
// admin call away; the admin command reads its --token-file with it too.
func ReadToken(path string) (string, error) {
	b, err := safefile.Read(path, maxTokenFile)
	if err != nil {
		return "", err
	}
	token := strings.TrimSpace(string(b))
	if token == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return token, nil
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func (a *api) record(action, result string) {
	if a.cfg.OnAction != nil {
		a.cfg.OnAction(action, result)
	}
}

// target names a record: by id (the key_hash of the logs), or by policy,
// scope and key as the client sent it.
type target struct {
	id     idem.RecordID
	policy *policy.Policy
}

func (a *api) target(r *http.Request) (target, error) {
	q := r.URL.Query()
	polName := q.Get("policy")
	var t target
	if polName != "" {
		for _, p := range a.cfg.Policies().Policies {
			if p.Name == polName {
				t.policy = p
			}
		}
		if t.policy == nil {
			return t, fmt.Errorf("no policy %q in force", polName)
		}
	}
	if id := q.Get("id"); id != "" {
		if b, err := hex.DecodeString(id); err != nil || len(b) != 16 {
			return t, errors.New("id must be the 32-hex-digit key_hash of the logs")
		}
		t.id = idem.RecordID(id)
		return t, nil
	}
	if t.policy == nil || !q.Has("scope") || !q.Has("key") {
		return t, errors.New("name the record by id, or by policy, scope and key")
	}
	key, err := idem.ParseKey(q.Get("key"), 0)
	if err != nil {
		return t, err
	}
	// A shadow policy's records live in its shadow key space.
	t.id = idem.RecordIDFor(t.policy.RecordNamespace(), q.Get("scope"), key)
	return t, nil
}

// recordView is a record as the API shows it: never the stored body, which
// may hold personal data.
type recordView struct {
	ID          string        `json:"id"`
	State       string        `json:"state"`
	Fingerprint string        `json:"fingerprint"`
	CreatedAt   time.Time     `json:"created_at"`
	AgeSeconds  float64       `json:"age_seconds"`
	Attempts    int           `json:"attempts"`
	LeaseUntil  *time.Time    `json:"lease_until,omitempty"`
	Response    *responseView `json:"response,omitempty"`
}

type responseView struct {
	Status      int  `json:"status"`
	Headers     int  `json:"headers"`
	BodyBytes   int  `json:"body_bytes"`
	BodyOmitted bool `json:"body_omitted"`
	// Sealed: headers and body are encrypted; body_bytes is the envelope.
	Sealed bool `json:"sealed"`
	// Compressed: headers and body are compressed together; body_bytes is
	// what the record holds (the envelope when sealed too).
	Compressed bool `json:"compressed"`
}

func (a *api) get(w http.ResponseWriter, r *http.Request, t target) {
	rec, err := a.cfg.Store.Get(r.Context(), t.id)
	if !a.acted(w, r, "lookup", t.id, err) {
		return
	}
	v := recordView{
		ID: string(t.id), State: rec.State.String(), Fingerprint: hex.EncodeToString(rec.Fingerprint[:]),
		CreatedAt: rec.CreatedAt, AgeSeconds: a.cfg.Now().Sub(rec.CreatedAt).Seconds(), Attempts: rec.Attempts,
	}
	if !rec.LeaseUntil.IsZero() {
		v.LeaseUntil = &rec.LeaseUntil
	}
	if resp := rec.Response; resp != nil {
		v.Response = &responseView{Status: resp.Status, Headers: len(resp.Headers), BodyBytes: len(resp.Body),
			BodyOmitted: resp.BodyOmitted, Sealed: resp.Sealed, Compressed: resp.Compressed}
	}
	writeJSON(w, http.StatusOK, v)
}

func (a *api) purge(w http.ResponseWriter, r *http.Request, t target) {
	err := a.cfg.Store.Purge(r.Context(), t.id)
	if a.acted(w, r, "purge", t.id, err) {
		writeJSON(w, http.StatusOK, map[string]string{"id": string(t.id), "result": "purged"})
	}
}

// resolveRequest settles an unknown record: {"action":"release"}, or
// {"action":"complete","status":201,"headers":[["content-type","..."]],
// "body":"text"} (or "body_base64").
type resolveRequest struct {
	Action     string      `json:"action"`
	Status     int         `json:"status"`
	Headers    [][2]string `json:"headers"`
	Body       string      `json:"body"`
	BodyBase64 string      `json:"body_base64"`
}

func (a *api) resolve(w http.ResponseWriter, r *http.Request, t target) {
	var req resolveRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 8<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "body: "+err.Error())
		return
	}
	var resp *idem.Response
	retention := policy.DefaultRetention
	if t.policy != nil {
		retention = t.policy.Retention
	}
	switch req.Action {
	case "release":
	case "complete":
		if req.Status < 100 || req.Status > 599 {
			writeError(w, http.StatusBadRequest, "complete needs a status from 100 to 599")
			return
		}
		body := []byte(req.Body)
		if req.BodyBase64 != "" {
			var err error
			if body, err = base64.StdEncoding.DecodeString(req.BodyBase64); err != nil {
				writeError(w, http.StatusBadRequest, "body_base64: "+err.Error())
				return
			}
		}
		resp = &idem.Response{Status: req.Status, Body: body}
		for _, h := range req.Headers {
			resp.Headers = append(resp.Headers, idem.Header{Name: strings.ToLower(h[0]), Value: h[1]})
		}
	default:
		writeError(w, http.StatusBadRequest, `action must be "release" or "complete"`)
		return
	}
	if resp != nil && a.cfg.Sealer != nil && (t.policy == nil || t.policy.Encrypt) {
		sealed, err := a.cfg.Sealer.Seal(t.id, *resp)
		if err != nil {
			writeError(w, http.StatusInternalServerError, "seal: "+err.Error())
			return
		}
		resp = &sealed
	}
	err := a.cfg.Store.Resolve(r.Context(), t.id, resp, retention)
	if a.acted(w, r, "resolve_"+req.Action, t.id, err) {
		writeJSON(w, http.StatusOK, map[string]string{"id": string(t.id), "result": req.Action})
	}
}

// onRecord answers 400 to a request that names no record (target) and
// hands the others to h.
func (a *api) onRecord(h func(http.ResponseWriter, *http.Request, target)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		t, err := a.target(r)
		if err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		h(w, r, t)
	}
}

// acted logs and counts an action on record id whose store call returned
// err; when err is not nil it answers it too and reports false.
func (a *api) acted(w http.ResponseWriter, r *http.Request, action string, id idem.RecordID, err error) bool {
	result := "ok"
	level := slog.LevelInfo
	if err != nil {
		result, level = "error", slog.LevelWarn
		if errors.Is(err, idem.ErrNotFound) || errors.Is(err, idem.ErrNotUnknown) {
			result = "refused"
		}
	}
	a.record(action, result)
	a.cfg.Logger.LogAttrs(r.Context(), level, "admin action", slog.String("action", action),
		slog.String("key_hash", string(id)), slog.String("result", result), slog.String("remote", r.RemoteAddr),
		slog.String("error", errString(err)))
	if err != nil {
		writeStoreError(w, err)
	}
	return err == nil
}

func writeStoreError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, idem.ErrNotFound):
		writeError(w, http.StatusNotFound, "no such record")
	case errors.Is(err, idem.ErrNotUnknown):
		writeError(w, http.StatusConflict, "only a record in state unknown can be resolved")
	default:
		writeError(w, http.StatusServiceUnavailable, "store: "+err.Error())
	}
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
