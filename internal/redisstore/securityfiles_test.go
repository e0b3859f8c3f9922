package redisstore_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/redisstore"
	"github.com/idem-extproc/idem-extproc/internal/testing/certtest"
	"github.com/idem-extproc/idem-extproc/internal/testing/filekinds"
)

// TestSecurityFileKinds: the password file (16 KiB at most), the CA bundle
// and the client certificate and key (1 MiB each) are read from regular
// files only; any other kind is refused by path and kind, without
// blocking or quoting the file. A regular file, even an empty one, is a
// password.
func TestSecurityFileKinds(t *testing.T) {
	refusedAs := map[filekinds.Kind]string{
		filekinds.TooBig:    "larger than",
		filekinds.FIFO:      "a FIFO",
		filekinds.DevZero:   "a character device",
		filekinds.Directory: "a directory",
		filekinds.Socket:    "a socket",
	}
	ca := certtest.NewCA(t, "redis")
	leaf := ca.Issue(certtest.Options{CommonName: "client"})
	roles := []struct {
		name  string
		url   string
		limit int64
		valid string // a file the role accepts
		sec   func(path string) redisstore.Security
		// holds: an empty file or a secret is refused for what it holds
		holds bool
	}{
		{"password", "redis://127.0.0.1:6379", 16 << 10, "",
			func(p string) redisstore.Security { return redisstore.Security{PasswordFile: p} }, false},
		{"CA", "rediss://127.0.0.1:6379", 1 << 20, ca.CertFile,
			func(p string) redisstore.Security { return redisstore.Security{CAFile: p} }, true},
		{"cert", "rediss://127.0.0.1:6379", 1 << 20, leaf.CertFile,
			func(p string) redisstore.Security { return redisstore.Security{CertFile: p, KeyFile: leaf.KeyFile} }, true},
		{"key", "rediss://127.0.0.1:6379", 1 << 20, leaf.KeyFile,
			func(p string) redisstore.Security { return redisstore.Security{CertFile: leaf.CertFile, KeyFile: p} }, true},
	}
	for _, r := range roles {
		valid := []byte("pa55word\n")
		if r.valid != "" {
			var err error
			if valid, err = os.ReadFile(r.valid); err != nil {
				t.Fatal(err)
			}
		}
		for _, k := range filekinds.All() {
			t.Run(r.name+"/"+string(k), func(t *testing.T) {
				path := filepath.Join(t.TempDir(), "f")
				filekinds.Make(t, k, path, valid, r.limit)
				var err error
				filekinds.Returns(t, "NewSecureClient", func() {
					var c interface{ Close() error }
					if c, err = redisstore.NewSecureClient(r.url, time.Second, r.sec(path)); err == nil {
						_ = c.Close()
					}
				})
				want, refused := refusedAs[k]
				switch {
				case !refused && !(r.holds && (k == filekinds.Empty || k == filekinds.Secret)):
					if err != nil {
						t.Fatalf("refused: %v", err)
					}
				case err == nil:
					t.Fatalf("%s accepted", k)
				case strings.Contains(err.Error(), filekinds.SecretMark):
					t.Fatalf("error %q holds the file's contents", err)
				case refused && (!strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), path)):
					t.Fatalf("error %q: want it to name %s and say %q", err, path, want)
				}
			})
		}
	}
}
