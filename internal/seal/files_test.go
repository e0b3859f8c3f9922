package seal

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/testing/filekinds"
)

// ringRefusedAs is what the error says of each kind of key ring file but
// the regular one, without the file's contents.
var ringRefusedAs = map[filekinds.Kind]string{
	filekinds.Empty:     "no key",
	filekinds.TooBig:    "larger than 64 KiB",
	filekinds.FIFO:      "a FIFO",
	filekinds.DevZero:   "a character device",
	filekinds.Directory: "a directory",
	filekinds.Socket:    "a socket",
	filekinds.Secret:    "want \"<key id> <base64 key>\"",
}

// TestRingFileKinds: the key ring is read from a regular file only, at
// start and on change; any other kind of file is refused by path and
// kind, without blocking or quoting it, and a change refused keeps the
// keys in force and is told to OnReload (which the daemon counts).
func TestRingFileKinds(t *testing.T) {
	valid := []byte("k1 " + key(t) + "\n")
	for _, k := range filekinds.All() {
		t.Run(string(k), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "keys")
			filekinds.Make(t, k, path, valid, maxRingFile)
			var err error
			filekinds.Returns(t, "LoadRing", func() { _, err = LoadRing(path, slog.New(slog.DiscardHandler)) })
			if k == filekinds.Regular {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if msg := errString(err); !strings.Contains(msg, ringRefusedAs[k]) || !strings.Contains(msg, path) ||
				strings.Contains(msg, filekinds.SecretMark) {
				t.Fatalf("LoadRing = %v: want it to name %s and say %q, without the file's contents", err, path, ringRefusedAs[k])
			}

			path = filepath.Join(t.TempDir(), "keys")
			if err := os.WriteFile(path, []byte("k0 "+key(t)+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			var log bytes.Buffer
			r, err := loadRing(path, slog.New(slog.NewTextHandler(&log, nil)), 0)
			if err != nil {
				t.Fatal(err)
			}
			var told []error
			r.OnReload(func(err error) { told = append(told, err) })
			filekinds.Replace(t, k, path, valid, maxRingFile)
			var active string
			filekinds.Returns(t, "ActiveKey", func() { active = r.ActiveKey() })
			if active != "k0" {
				t.Fatalf("active key %q after a refused change, want k0 kept", active)
			}
			if len(told) != 1 || told[0] == nil {
				t.Fatalf("OnReload told %v, want the refusal", told)
			}
			if !strings.Contains(log.String(), "does not load") || strings.Contains(log.String(), filekinds.SecretMark) {
				t.Fatalf("log %q: want the refusal, without the file's contents", log.String())
			}
		})
	}
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}
