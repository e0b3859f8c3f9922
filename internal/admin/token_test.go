package admin

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/testing/filekinds"
	"github.com/idem-extproc/idem-extproc/internal/testing/testwait"
)

// tokenAPI serves the admin API on a token file, recording its actions
// and log.
type tokenAPI struct {
	h       http.Handler
	log     *bytes.Buffer
	mu      sync.Mutex
	actions []string
}

func newTokenAPI(path string) *tokenAPI {
	api := &tokenAPI{log: &bytes.Buffer{}}
	api.h = Handler(Config{TokenFile: path, Logger: slog.New(slog.NewTextHandler(api.log, nil)),
		OnAction: func(action, result string) {
			api.mu.Lock()
			defer api.mu.Unlock()
			api.actions = append(api.actions, action+" "+result)
		}})
	return api
}

// status is the answer to a lookup with token: 400 (no record named)
// once the token is accepted.
func (api *tokenAPI) status(t *testing.T, token string) int {
	t.Helper()
	var code int
	filekinds.Returns(t, "admin request", func() {
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodGet, Prefix+"records", nil)
		r.Header.Set("Authorization", "Bearer "+token)
		api.h.ServeHTTP(w, r)
		code = w.Code
	})
	return code
}

func (api *tokenAPI) did(action string) bool {
	api.mu.Lock()
	defer api.mu.Unlock()
	for _, a := range api.actions {
		if a == action {
			return true
		}
	}
	return false
}

// TestTokenFileKindsAtStart: the token is read from a regular file only;
// any other kind of file is refused by path and kind without blocking,
// and the API refuses every request until a token file is in place.
// A regular file holding a secret is a token like any other.
func TestTokenFileKindsAtStart(t *testing.T) {
	refused := map[filekinds.Kind]string{
		filekinds.Empty:     "is empty",
		filekinds.TooBig:    "larger than 16 KiB",
		filekinds.FIFO:      "a FIFO",
		filekinds.DevZero:   "a character device",
		filekinds.Directory: "a directory",
		filekinds.Socket:    "a socket",
	}
	for _, k := range filekinds.All() {
		t.Run(string(k), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "token")
			filekinds.Make(t, k, path, []byte("t0ken\n"), maxTokenFile)
			var err error
			filekinds.Returns(t, "ReadToken", func() { _, err = ReadToken(path) })
			want, isRefused := refused[k]
			if !isRefused {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), path) {
				t.Fatalf("ReadToken = %v, want it to name %s and say %q", err, path, want)
			}
			api := newTokenAPI(path)
			if api.status(t, "t0ken") != http.StatusServiceUnavailable {
				t.Fatal("the API served with no token read")
			}
			filekinds.Replace(t, filekinds.Regular, path, []byte("t0ken\n"), maxTokenFile)
			testwait.Until(t, "the token in force once its file is", func() bool {
				return api.status(t, "t0ken") == http.StatusBadRequest
			})
		})
	}
}

// TestTokenFileKindsOnChange: the token is read when its file changes, not
// on every request. A new file that does not load keeps the previous token,
// logged and counted, and no request waits on it; a new regular file puts
// its token in force.
func TestTokenFileKindsOnChange(t *testing.T) {
	for _, k := range filekinds.All() {
		t.Run(string(k), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "token")
			if err := os.WriteFile(path, []byte("old-token\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			api := newTokenAPI(path)
			if got := api.status(t, "old-token"); got != http.StatusBadRequest {
				t.Fatalf("with the token: %d, want 400", got)
			}
			filekinds.Replace(t, k, path, []byte("new-token\n"), maxTokenFile)
			if k == filekinds.Regular || k == filekinds.Secret {
				testwait.Until(t, "the new token in force", func() bool {
					return api.status(t, "old-token") == http.StatusUnauthorized
				})
				if !api.did("token_reload ok") {
					t.Fatal("the reload was not counted")
				}
				return
			}
			testwait.Until(t, "the refused reload counted", func() bool {
				_ = api.status(t, "old-token")
				return api.did("token_reload rejected")
			})
			if got := api.status(t, "old-token"); got != http.StatusBadRequest {
				t.Fatalf("after a refused change: %d, want the old token still in force (400)", got)
			}
			if !strings.Contains(api.log.String(), "keeping the previous token") {
				t.Fatalf("log %q: want the refusal", api.log.String())
			}
		})
	}
}
