package tlsfiles

import (
	"bytes"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/testing/certtest"
	"github.com/idem-extproc/idem-extproc/internal/testing/filekinds"
	"github.com/idem-extproc/idem-extproc/internal/testing/testwait"
)

// syncBuffer is a log the reload writes while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// refusedAs is what the error says of each kind of PEM file but the
// regular one, without the file's contents.
var refusedAs = map[filekinds.Kind]string{
	filekinds.TooBig:    "larger than 1 MiB",
	filekinds.FIFO:      "a FIFO",
	filekinds.DevZero:   "a character device",
	filekinds.Directory: "a directory",
	filekinds.Socket:    "a socket",
}

// tlsFiles makes a certificate, key and client CA in a directory of their
// own.
func tlsFiles(t *testing.T) Files {
	ca := certtest.NewCA(t, "clients")
	leaf := ca.Issue(certtest.Options{CommonName: "server", DNSNames: []string{"localhost"}, Dir: t.TempDir()})
	return Files{Cert: leaf.CertFile, Key: leaf.KeyFile, ClientCA: ca.CertFile}
}

// TestFileKinds: the certificate, the key and the client CA are each read
// from a regular file of at most 1 MiB; any other kind is refused by path
// and kind at start, without blocking or quoting the file, and on
// rotation the certificates in force stay and OnReload (which the daemon
// counts) is told.
func TestFileKinds(t *testing.T) {
	roles := map[string]func(*Files) *string{
		"cert":      func(f *Files) *string { return &f.Cert },
		"key":       func(f *Files) *string { return &f.Key },
		"client CA": func(f *Files) *string { return &f.ClientCA },
	}
	for role, at := range roles {
		for _, k := range filekinds.All() {
			t.Run(role+"/"+string(k), func(t *testing.T) {
				t.Parallel() // each waits out checkEvery
				files := tlsFiles(t)
				path := *at(&files)
				valid, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.Remove(path); err != nil {
					t.Fatal(err)
				}
				filekinds.Make(t, k, path, valid, maxPEMFile)
				filekinds.Returns(t, "NewServer", func() { _, err = NewServer(files, slog.New(slog.DiscardHandler)) })
				checkRefusal(t, k, path, err)

				files = tlsFiles(t)
				path = *at(&files)
				var log syncBuffer
				s, err := NewServer(files, slog.New(slog.NewTextHandler(&log, nil)))
				if err != nil {
					t.Fatal(err)
				}
				var told atomic.Int32
				s.OnReload(func(err error) {
					if err != nil {
						told.Add(1)
					}
				})
				before, _ := s.current()
				filekinds.Replace(t, k, path, valid, maxPEMFile)
				if k == filekinds.Regular {
					return // the same certificate again, or another CA's: both load
				}
				testwait.Until(t, "the refused rotation logged", func() bool {
					filekinds.Returns(t, "a handshake's look at the files", func() { _, _ = s.current() })
					return strings.Contains(log.String(), "do not load")
				})
				if after, _ := s.current(); after != before {
					t.Fatal("a refused rotation replaced the certificate")
				}
				if told.Load() != 1 {
					t.Fatalf("OnReload told %d refusals, want 1", told.Load())
				}
				if strings.Contains(log.String(), filekinds.SecretMark) {
					t.Fatalf("log %q holds the file's contents", log.String())
				}
			})
		}
	}
}

// checkRefusal fails the test unless err refuses a file of kind k at path
// as refusedAs says; an empty file or a secret is refused for what it
// holds. No error quotes the file.
func checkRefusal(t *testing.T, k filekinds.Kind, path string, err error) {
	t.Helper()
	if k == filekinds.Regular {
		if err != nil {
			t.Fatalf("refused: %v", err)
		}
		return
	}
	if err == nil {
		t.Fatalf("%s accepted", k)
	}
	msg := err.Error()
	if strings.Contains(msg, filekinds.SecretMark) {
		t.Fatalf("error %q holds the file's contents", msg)
	}
	if want, ok := refusedAs[k]; ok && (!strings.Contains(msg, want) || !strings.Contains(msg, path)) {
		t.Fatalf("error %q: want it to name %s and say %q", msg, path, want)
	}
}
