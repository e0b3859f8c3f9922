package safefile

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/testing/filekinds"
)

// TestKinds: a regular file is read whole, whatever it holds; every other
// kind is refused with its path and what it is, without blocking.
func TestKinds(t *testing.T) {
	const limit = 1 << 10
	valid := []byte("token\n")
	refused := map[filekinds.Kind]string{
		filekinds.TooBig:    "larger than 1 KiB",
		filekinds.FIFO:      "a FIFO",
		filekinds.DevZero:   "a character device",
		filekinds.Directory: "a directory",
		filekinds.Socket:    "a socket",
	}
	for _, k := range filekinds.All() {
		t.Run(string(k), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "f")
			filekinds.Make(t, k, path, valid, limit)
			var b []byte
			var err error
			filekinds.Returns(t, "Read", func() { b, err = Read(path, limit) })
			want, isRefused := refused[k]
			switch {
			case isRefused && err == nil:
				t.Fatalf("read %d bytes, want refused (%s)", len(b), want)
			case isRefused && (!strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), path)):
				t.Fatalf("error %q, want it to name %s and %q", err, path, want)
			case !isRefused && err != nil:
				t.Fatalf("refused: %v", err)
			case k == filekinds.Regular && string(b) != string(valid):
				t.Fatalf("read %q, want %q", b, valid)
			}
		})
	}
}

// TestGrownPastStat: a file whose stat says it is small but that holds
// more (as one growing after fstat would) is refused by the read itself.
// Files under /proc report a size of 0.
func TestGrownPastStat(t *testing.T) {
	_, err := Read("/proc/self/status", 16)
	if err == nil || !strings.Contains(err.Error(), "larger than 16 bytes") {
		t.Fatalf("Read = %v, want refused as larger than 16 bytes", err)
	}
}

func TestMissing(t *testing.T) {
	if _, err := Read(filepath.Join(t.TempDir(), "none"), 1); err == nil {
		t.Fatal("a missing file was read")
	}
}
