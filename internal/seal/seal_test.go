package seal

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

func key(t *testing.T) string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(b)
}

func writeRing(t *testing.T, path string, lines ...string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func ring(t *testing.T, lines ...string) (*Ring, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "keys")
	writeRing(t, path, lines...)
	// Every use looks at the file, so that a rotation is seen at once.
	r, err := loadRing(path, slog.New(slog.DiscardHandler), 0)
	if err != nil {
		t.Fatal(err)
	}
	return r, path
}

var resp = idem.Response{
	Status:  201,
	Headers: []idem.Header{{Name: "content-type", Value: "application/json"}, {Name: "x-dup", Value: "1"}, {Name: "x-dup", Value: ""}},
	Body:    []byte(`{"card":"4111 1111 1111 1111"}`),
}

func TestRoundTrip(t *testing.T) {
	r, _ := ring(t, "# comment", "", "k1 "+key(t))
	id := idem.RecordIDFor("p", "s", "k")
	sealed, err := r.Seal(id, resp)
	if err != nil {
		t.Fatal(err)
	}
	if !sealed.Sealed || len(sealed.Headers) != 0 || strings.Contains(string(sealed.Body), "4111") || sealed.Status != 201 {
		t.Fatalf("sealed = %+v", sealed)
	}
	got, err := r.Open(id, sealed)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != 201 || string(got.Body) != string(resp.Body) || len(got.Headers) != 3 || got.Headers[2] != resp.Headers[2] || got.Sealed {
		t.Fatalf("opened = %+v", got)
	}
	// Headers only (body omitted) survive too.
	ho := idem.Response{Status: 200, Headers: resp.Headers, BodyOmitted: true}
	s2, _ := r.Seal(id, ho)
	o2, err := r.Open(id, s2)
	if err != nil || !o2.BodyOmitted || len(o2.Body) != 0 || len(o2.Headers) != 3 {
		t.Fatalf("headers-only: %+v %v", o2, err)
	}
	// A compressed response keeps its flag through the envelope, and the
	// flag is bound: cleared, the envelope does not open.
	cz := idem.Response{Status: 201, Body: []byte("\x01frame"), Compressed: true}
	s3, _ := r.Seal(id, cz)
	if !s3.Compressed {
		t.Fatalf("sealed compressed response lost its flag: %+v", s3)
	}
	o3, err := r.Open(id, s3)
	if err != nil || !o3.Compressed || string(o3.Body) != "\x01frame" || len(o3.Headers) != 0 {
		t.Fatalf("compressed: %+v %v", o3, err)
	}
	s3.Compressed = false
	if _, err := r.Open(id, s3); !errors.Is(err, ErrOpen) {
		t.Fatalf("compressed flag cleared: Open = %v, want ErrOpen", err)
	}
	// An unsealed response passes through Open unchanged.
	if plain, err := r.Open(id, resp); err != nil || string(plain.Body) != string(resp.Body) {
		t.Fatal("Open of an unsealed response changed it")
	}
}

func TestTamperingAndMisuseDoNotOpen(t *testing.T) {
	r, _ := ring(t, "k1 "+key(t))
	id := idem.RecordIDFor("p", "s", "k")
	sealed, _ := r.Seal(id, resp)
	for name, mutate := range map[string]func(idem.Response) (idem.RecordID, idem.Response){
		"flipped ciphertext byte": func(s idem.Response) (idem.RecordID, idem.Response) {
			b := append([]byte(nil), s.Body...)
			b[len(b)-5] ^= 1
			s.Body = b
			return id, s
		},
		"flipped nonce byte": func(s idem.Response) (idem.RecordID, idem.Response) {
			b := append([]byte(nil), s.Body...)
			b[5] ^= 0x80
			s.Body = b
			return id, s
		},
		"copied under another key": func(s idem.Response) (idem.RecordID, idem.Response) {
			return idem.RecordIDFor("p", "s", "other"), s
		},
		"status changed":          func(s idem.Response) (idem.RecordID, idem.Response) { s.Status = 200; return id, s },
		"body-omitted flag added": func(s idem.Response) (idem.RecordID, idem.Response) { s.BodyOmitted = true; return id, s },
		"compressed flag added":   func(s idem.Response) (idem.RecordID, idem.Response) { s.Compressed = true; return id, s },
		"truncated":               func(s idem.Response) (idem.RecordID, idem.Response) { s.Body = s.Body[:10]; return id, s },
		"empty":                   func(s idem.Response) (idem.RecordID, idem.Response) { s.Body = nil; return id, s },
		"unknown version": func(s idem.Response) (idem.RecordID, idem.Response) {
			b := append([]byte{9}, s.Body[1:]...)
			s.Body = b
			return id, s
		},
	} {
		t.Run(name, func(t *testing.T) {
			rid, bad := mutate(sealed)
			if _, err := r.Open(rid, bad); !errors.Is(err, ErrOpen) {
				t.Fatalf("Open = %v, want ErrOpen", err)
			}
		})
	}
	// A ring without the envelope's key cannot open it.
	other, _ := ring(t, "k2 "+key(t))
	if _, err := other.Open(id, sealed); !errors.Is(err, ErrOpen) || !strings.Contains(err.Error(), `"k1"`) {
		t.Fatalf("wrong ring: %v", err)
	}
	// The same key id with other key bytes fails authentication.
	impostor, _ := ring(t, "k1 "+key(t))
	if _, err := impostor.Open(id, sealed); !errors.Is(err, ErrOpen) {
		t.Fatalf("wrong key bytes: %v", err)
	}
}

// TestRotation: a new first key seals new records; records sealed with the
// old key open as long as it stays in the ring. The file is reread when it
// changes.
func TestRotation(t *testing.T) {
	k1, k2 := key(t), key(t)
	r, path := ring(t, "2026-10 "+k1)
	id := idem.RecordIDFor("p", "s", "k")
	old, _ := r.Seal(id, resp)
	writeRing(t, path, "2026-11 "+k2, "2026-10 "+k1)
	// A new modification time, even within the file system's clock tick.
	future := time.Now().Add(2 * time.Second)
	_ = os.Chtimes(path, future, future)
	if got := r.ActiveKey(); got != "2026-11" {
		t.Fatalf("active key %q after rotation", got)
	}
	fresh, _ := r.Seal(id, resp)
	if !strings.Contains(string(fresh.Body[:10]), "2026-11") {
		t.Fatal("new records must name the new key")
	}
	for _, s := range []idem.Response{old, fresh} {
		if _, err := r.Open(id, s); err != nil {
			t.Fatalf("open after rotation: %v", err)
		}
	}
	// Dropping the old key retires the old records' contents.
	writeRing(t, path, "2026-11 "+k2)
	future = future.Add(2 * time.Second)
	_ = os.Chtimes(path, future, future)
	if _, err := r.Open(id, old); !errors.Is(err, ErrOpen) {
		t.Fatalf("old record after its key left the ring: %v", err)
	}
	// A broken file keeps the ring as it was.
	writeRing(t, path, "not a key")
	future = future.Add(2 * time.Second)
	_ = os.Chtimes(path, future, future)
	if _, err := r.Open(id, fresh); err != nil {
		t.Fatalf("a broken ring file must not drop the keys: %v", err)
	}
}

func TestBadRingFiles(t *testing.T) {
	for name, content := range map[string]string{
		"empty":        "# only a comment\n",
		"no separator": "k1\n",
		"short key":    "k1 " + base64.StdEncoding.EncodeToString([]byte("short")) + "\n",
		"not base64":   "k1 !!!\n",
		"duplicate id": "k1 " + key(t) + "\nk1 " + key(t) + "\n",
		"id too long":  strings.Repeat("k", 65) + " " + key(t) + "\n",
	} {
		path := filepath.Join(t.TempDir(), "keys")
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadRing(path, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: error %v should name the file", name, err)
		}
	}
}
