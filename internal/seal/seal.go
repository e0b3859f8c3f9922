// Package seal encrypts stored responses at rest with AES-256-GCM.
//
// A sealed response keeps its status readable (operators and metrics use
// it) and puts its headers and body into one envelope:
//
//	version (1 byte, 1) | key id length (1 byte) | key id | nonce (12) | ciphertext and tag
//
// The associated data binds the envelope to its record id, status and
// flags, so an envelope copied under another key, or given another status,
// does not open. Each envelope names its key, so a key ring can rotate:
// new records use the first key of the ring, old ones keep opening with
// the key they name for as long as it stays in the ring.
package seal

import (
	"bufio"
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/rotated"
)

// ErrOpen is any failure to open an envelope: a key not in the ring, a
// damaged or tampered envelope, one moved to another record.
var ErrOpen = errors.New("seal: stored response does not open")

const version = 1

// Ring is a key ring loaded from a file; the file is read again when it
// changes.
//
// The file holds one key per line, "<key id> <base64 of 32 random bytes>";
// blank lines and lines starting with # are ignored. The first key seals,
// all of them open. Key ids are 1 to 64 characters without spaces. Make a
// key with: head -c 32 /dev/urandom | base64
type Ring struct {
	keys *rotated.Value[keySet]
}

// keySet is what the ring file holds.
type keySet struct {
	active string
	keys   map[string]cipher.AEAD
}

// checkEvery bounds how often the ring looks at the file's modification
// time.
const checkEvery = time.Second

// LoadRing reads the key ring at path.
func LoadRing(path string, log *slog.Logger) (*Ring, error) {
	return loadRing(path, log, checkEvery)
}

// loadRing is LoadRing looking at the file every interval (tests: 0, each
// use).
func loadRing(path string, log *slog.Logger, every time.Duration) (*Ring, error) {
	v, err := rotated.Load([]string{path}, func() (keySet, error) { return readRing(path) }, rotated.Options[keySet]{
		Every: every,
		OnReload: func(ks keySet, err error) {
			if err != nil {
				log.Error("key ring changed but does not load; keeping the previous keys", slog.String("error", err.Error()))
				return
			}
			log.Info("key ring reloaded", slog.String("active_key", ks.active), slog.Int("keys", len(ks.keys)))
		},
	})
	if err != nil {
		return nil, err
	}
	return &Ring{keys: v}, nil
}

func readRing(path string) (keySet, error) {
	f, err := os.Open(path)
	if err != nil {
		return keySet{}, fmt.Errorf("seal: key ring: %w", err)
	}
	defer f.Close()
	keys := map[string]cipher.AEAD{}
	active := ""
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		kid, b64, ok := strings.Cut(line, " ")
		if !ok || len(kid) > 64 {
			return keySet{}, fmt.Errorf("seal: %s:%d: want \"<key id> <base64 key>\"", path, n)
		}
		raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(b64))
		if err != nil || len(raw) != 32 {
			return keySet{}, fmt.Errorf("seal: %s:%d: key %q is not 32 bytes of base64", path, n, kid)
		}
		if _, dup := keys[kid]; dup {
			return keySet{}, fmt.Errorf("seal: %s:%d: key id %q appears twice", path, n, kid)
		}
		block, _ := aes.NewCipher(raw) // 32 bytes: AES-256, cannot fail
		aead, _ := cipher.NewGCM(block)
		keys[kid] = aead
		if active == "" {
			active = kid
		}
	}
	if err := sc.Err(); err != nil {
		return keySet{}, fmt.Errorf("seal: key ring: %w", err)
	}
	if active == "" {
		return keySet{}, fmt.Errorf("seal: %s: no key", path)
	}
	return keySet{active: active, keys: keys}, nil
}

// current returns the keys in force, reloaded when the file changed
// (package rotated): a file that does not load leaves the ring as it was.
func (r *Ring) current() (string, map[string]cipher.AEAD) {
	ks := r.keys.Current()
	return ks.active, ks.keys
}

// ActiveKey names the key that seals.
func (r *Ring) ActiveKey() string {
	active, _ := r.current()
	return active
}

func aad(id idem.RecordID, resp *idem.Response) []byte {
	b := make([]byte, 0, 64)
	b = append(b, "idem-extproc seal v1\x00"...)
	b = append(b, id...)
	b = binary.AppendUvarint(b, uint64(resp.Status))
	if resp.BodyOmitted {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	return b
}

// Seal encrypts resp's headers and body for the record id.
func (r *Ring) Seal(id idem.RecordID, resp idem.Response) (idem.Response, error) {
	if resp.Sealed {
		return resp, nil
	}
	kid, keys := r.current()
	aead := keys[kid]
	plain := binary.AppendUvarint(nil, uint64(len(resp.Headers)))
	for _, h := range resp.Headers {
		plain = binary.AppendUvarint(plain, uint64(len(h.Name)))
		plain = append(plain, h.Name...)
		plain = binary.AppendUvarint(plain, uint64(len(h.Value)))
		plain = append(plain, h.Value...)
	}
	plain = append(plain, resp.Body...)
	env := make([]byte, 0, 2+len(kid)+aead.NonceSize()+len(plain)+aead.Overhead())
	env = append(env, version, byte(len(kid)))
	env = append(env, kid...)
	nonce := env[len(env) : len(env)+aead.NonceSize()]
	if _, err := rand.Read(nonce); err != nil {
		return idem.Response{}, fmt.Errorf("seal: nonce: %w", err)
	}
	env = env[:len(env)+aead.NonceSize()]
	out := idem.Response{Status: resp.Status, BodyOmitted: resp.BodyOmitted, Sealed: true}
	out.Body = aead.Seal(env, nonce, plain, aad(id, &out))
	return out, nil
}

// Open decrypts a sealed response of the record id. An unsealed response
// is returned as it is.
func (r *Ring) Open(id idem.RecordID, resp idem.Response) (idem.Response, error) {
	if !resp.Sealed {
		return resp, nil
	}
	env := resp.Body
	if len(env) < 2 || env[0] != version || len(env) < 2+int(env[1]) {
		return idem.Response{}, fmt.Errorf("%w: malformed envelope", ErrOpen)
	}
	kid := string(env[2 : 2+int(env[1])])
	_, keys := r.current()
	aead, ok := keys[kid]
	if !ok {
		return idem.Response{}, fmt.Errorf("%w: key %q is not in the ring", ErrOpen, kid)
	}
	rest := env[2+int(env[1]):]
	if len(rest) < aead.NonceSize() {
		return idem.Response{}, fmt.Errorf("%w: malformed envelope", ErrOpen)
	}
	plain, err := aead.Open(nil, rest[:aead.NonceSize()], rest[aead.NonceSize():], aad(id, &resp))
	if err != nil {
		return idem.Response{}, fmt.Errorf("%w: authentication failed", ErrOpen)
	}
	out := idem.Response{Status: resp.Status, BodyOmitted: resp.BodyOmitted}
	rd := bytes.NewReader(plain)
	n, err := binary.ReadUvarint(rd)
	if err != nil || n > uint64(len(plain)) {
		return idem.Response{}, fmt.Errorf("%w: malformed contents", ErrOpen)
	}
	for range n {
		name, err1 := readString(rd)
		value, err2 := readString(rd)
		if err1 != nil || err2 != nil {
			return idem.Response{}, fmt.Errorf("%w: malformed contents", ErrOpen)
		}
		out.Headers = append(out.Headers, idem.Header{Name: name, Value: value})
	}
	if rd.Len() > 0 {
		out.Body = plain[len(plain)-rd.Len():]
	}
	return out, nil
}

func readString(rd *bytes.Reader) (string, error) {
	n, err := binary.ReadUvarint(rd)
	if err != nil || n > uint64(rd.Len()) {
		return "", errors.New("short")
	}
	b := make([]byte, n)
	_, _ = rd.Read(b)
	return string(b), nil
}
