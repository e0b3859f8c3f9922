package seal

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// TestNewSealsAreVersion2: every new envelope is version 2
// (XChaCha20-Poly1305) under the ring's first key, with a 24-byte nonce
// drawn afresh for each seal.
func TestNewSealsAreVersion2(t *testing.T) {
	r, _ := ring(t, "k1 "+key(t), "old "+key(t))
	id := idem.RecordIDFor("p", "s", "k")
	a, err := r.Seal(id, resp)
	if err != nil {
		t.Fatal(err)
	}
	b, err := r.Seal(id, resp)
	if err != nil {
		t.Fatal(err)
	}
	const header, nonce, tag = 2 + len("k1"), 24, 16
	for _, s := range []idem.Response{a, b} {
		env := s.Body
		if len(env) < header || env[0] != 2 || env[1] != 2 || string(env[2:4]) != "k1" {
			t.Fatalf("envelope header % x, want version 2 naming k1", env[:min(len(env), header)])
		}
		if want := header + nonce + len(encodeContents(resp)) + tag; len(env) != want {
			t.Fatalf("envelope of %d bytes, want %d (a %d-byte nonce)", len(env), want, nonce)
		}
	}
	if bytes.Equal(a.Body[header:header+nonce], b.Body[header:header+nonce]) {
		t.Fatal("two seals drew the same nonce")
	}
}

// TestEnvelopeHeaderIsBound: a version-2 envelope relabelled with another
// key id does not open, even when that id holds the same key bytes.
func TestEnvelopeHeaderIsBound(t *testing.T) {
	k := key(t)
	r, _ := ring(t, "k1 "+k, "k2 "+k)
	id := idem.RecordIDFor("p", "s", "k")
	sealed, err := r.Seal(id, resp)
	if err != nil {
		t.Fatal(err)
	}
	moved := sealed
	moved.Body = bytes.Clone(sealed.Body)
	moved.Body[3] = '2' // "k1" -> "k2"
	if _, err := r.Open(id, moved); !errors.Is(err, ErrOpen) {
		t.Fatalf("an envelope relabelled k2 opened: %v", err)
	}
	if _, err := r.Open(id, sealed); err != nil {
		t.Fatalf("the envelope itself: %v", err)
	}
}

// TestMalformedEnvelopes: an envelope that is empty, truncated, of an
// unknown version or naming a key the ring lacks is an ErrOpen saying
// which, never a panic.
func TestMalformedEnvelopes(t *testing.T) {
	r, _ := ring(t, "k1 "+key(t))
	id := idem.RecordIDFor("p", "s", "k")
	v2, err := r.Seal(id, resp)
	if err != nil {
		t.Fatal(err)
	}
	hdr := []byte{2, 2, 'k', '1'}
	v1hdr := []byte{1, 2, 'k', '1'}
	zeros := func(n int) []byte { return make([]byte, n) }
	for _, c := range []struct {
		name string
		env  []byte
		want string
	}{
		{"empty", nil, "empty envelope"},
		{"version 0", []byte{0, 2, 'k', '1'}, "unknown envelope version 0"},
		{"version 3", append([]byte{3}, v2.Body[1:]...), "unknown envelope version 3"},
		{"version 255", []byte{255}, "unknown envelope version 255"},
		{"version byte alone", []byte{2}, "truncated envelope: 1 bytes end inside its header"},
		{"key id cut short", []byte{2, 10, 'k', '1'}, "truncated envelope: 4 bytes end inside its header"},
		{"version 2, nonce cut short", append(bytes.Clone(hdr), zeros(20)...), "version 2 needs at least 40 bytes after its header, has 20"},
		{"version 2, tag cut short", append(bytes.Clone(hdr), zeros(24+15)...), "version 2 needs at least 40 bytes after its header, has 39"},
		{"version 2, cut inside the ciphertext", v2.Body[:len(v2.Body)-20], "authentication failed (version 2, key \"k1\")"},
		{"version 1, tag cut short", append(bytes.Clone(v1hdr), zeros(12+15)...), "version 1 needs at least 28 bytes after its header, has 27"},
		{"version 1, forged", append(bytes.Clone(v1hdr), zeros(12+40)...), "authentication failed (version 1, key \"k1\")"},
		{"version 2 read as version 1", append([]byte{1}, v2.Body[1:]...), "authentication failed (version 1, key \"k1\")"},
		{"unknown key", []byte{2, 2, 'z', 'z'}, `key "zz" is not in the ring`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := r.Open(id, idem.Response{Status: 201, Sealed: true, Body: c.env})
			if !errors.Is(err, ErrOpen) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Open = %v, want ErrOpen saying %q", err, c.want)
			}
		})
	}
}

// FuzzOpen: no envelope panics Open; what does not open is an ErrOpen;
// what opens seals again and opens to the same response.
func FuzzOpen(f *testing.F) {
	for _, v := range fixedEnvelopes {
		env := fixedEnvelope(f, v.envelope)
		f.Add(env, v.sealed.Status, v.sealed.BodyOmitted)
		f.Add(env[:len(env)-1], v.sealed.Status, v.sealed.BodyOmitted)
		f.Add(env[:2+6+3], v.sealed.Status, v.sealed.BodyOmitted)
	}
	for _, env := range [][]byte{nil, {0}, {1}, {2}, {3, 0}, {2, 255}, {1, 0, 0}} {
		f.Add(env, 200, false)
	}
	path := filepath.Join(f.TempDir(), "keys")
	if err := os.WriteFile(path, []byte("v1-key "+vectorKey+"\nv2-key "+vectorKey+"\n"), 0o600); err != nil {
		f.Fatal(err)
	}
	r, err := LoadRing(path, slog.New(slog.DiscardHandler))
	if err != nil {
		f.Fatal(err)
	}
	id := idem.RecordIDFor("payments", "api.example.com:443", "vector-1")
	f.Fuzz(func(t *testing.T, env []byte, status int, omitted bool) {
		got, err := r.Open(id, idem.Response{Status: status, BodyOmitted: omitted, Sealed: true, Body: env})
		if err != nil {
			if !errors.Is(err, ErrOpen) {
				t.Fatalf("error %v does not wrap ErrOpen", err)
			}
			return
		}
		if got.Sealed || got.Status != status || got.BodyOmitted != omitted {
			t.Fatalf("opened %+v from status %d, omitted %v", got, status, omitted)
		}
		again, err := r.Seal(id, got)
		if err != nil {
			t.Fatal(err)
		}
		back, err := r.Open(id, again)
		if err != nil || !sameResponse(back, got) {
			t.Fatalf("resealed %+v opens as %+v, %v", got, back, err)
		}
	})
}

// FuzzDecodeContents: no plaintext panics the decoder (a leaked key lets
// anyone seal anything); what decodes encodes and decodes to the same.
func FuzzDecodeContents(f *testing.F) {
	f.Add(encodeContents(resp))
	f.Add(encodeContents(idem.Response{Headers: resp.Headers}))
	for _, b := range [][]byte{nil, {0}, {1}, {1, 5, 'a'}, {0x80}, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, {2, 0, 0}} {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, plain []byte) {
		got, err := decodeContents(plain)
		if err != nil {
			return
		}
		back, err := decodeContents(encodeContents(got))
		if err != nil || !sameResponse(back, got) {
			t.Fatalf("%+v re-encoded decodes as %+v, %v", got, back, err)
		}
	})
}

// TestRingRefusedWhereItsAlgorithmsAreForbidden: a process that forbids
// the ring's algorithms (GODEBUG=fips140=only refuses AES-GCM with
// caller-chosen nonces and ChaCha20-Poly1305) gets an error naming the
// ring file at load, never a ring that panics on first use. The check
// runs in a child process because the setting is read at start.
func TestRingRefusedWhereItsAlgorithmsAreForbidden(t *testing.T) {
	if path := os.Getenv("SEAL_TEST_FIPS_RING"); path != "" {
		r, err := LoadRing(path, slog.New(slog.DiscardHandler))
		if err == nil {
			_, err = r.Seal(idem.RecordIDFor("p", "s", "k"), resp)
			t.Fatalf("the ring loaded; Seal = %v", err)
		}
		if !strings.Contains(err.Error(), path+":1:") || !strings.Contains(err.Error(), "FIPS 140-only") {
			t.Fatalf("error %q should name the file's line and the FIPS 140-only mode", err)
		}
		return
	}
	path := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(path, []byte("k1 "+key(t)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const name = "TestRingRefusedWhereItsAlgorithmsAreForbidden"
	cmd := exec.Command(os.Args[0], "-test.run=^"+name+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "GODEBUG=fips140=only", "SEAL_TEST_FIPS_RING="+path)
	out, err := cmd.CombinedOutput()
	// The child must have run this test and passed it, not matched nothing.
	if err != nil || !strings.Contains(string(out), "--- PASS: "+name) {
		t.Fatalf("under GODEBUG=fips140=only: %v\n%s", err, out)
	}
}
