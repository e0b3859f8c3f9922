// Package seal encrypts stored responses at rest.
//
// A sealed response keeps its status readable (operators and metrics use
// it) and puts its headers and body into one envelope:
//
//	version (1 byte) | key id length (1 byte) | key id | nonce | ciphertext and tag
//
// Version 2, which every new envelope uses, is XChaCha20-Poly1305 with a
// random 24-byte nonce under a key derived from the ring's key. Version 1
// is AES-256-GCM with a random 12-byte nonce under the ring's key itself;
// it is only opened, so that records sealed before version 2 keep opening
// until they expire.
//
// Why version 2: a random 96-bit nonce makes AES-GCM safe for about 2^32
// seals per key, counted over every replica that shares the ring (NIST SP
// 800-38D §8.3; crypto/cipher.NewGCMWithRandomNonce: "A given key MUST NOT
// be used to encrypt more than 2^32 messages"), which a busy deployment
// reaches in weeks. XChaCha20's 192-bit nonce can be drawn at random
// without that count: a repeat is expected only after about 2^96 seals,
// and stays below a 2^-32 chance up to 2^80 of them
// (draft-irtf-cfrg-xchacha, "Motivation for XChaCha20-Poly1305";
// golang.org/x/crypto/chacha20poly1305.NewX: "suitable to be generated
// randomly without risk of collisions"). ChaCha20-Poly1305
// itself sets no limit on the number of messages sealed under a key
// (draft-irtf-cfrg-aead-limits-13 §6.3.1); its integrity bound counts
// forgery attempts, envelopes that fail to open (§6.3.2). XAES-256-GCM
// would lift the bound as well, but the standard library keeps it internal
// to its FIPS module and golang.org/x/crypto has none, while
// XChaCha20-Poly1305 is exported there and widely implemented.
//
// The associated data binds the envelope to its record id, status and
// flags, so an envelope copied under another key, or given another status,
// does not open; in version 2 it binds the envelope's header (version and
// key id) too. Each envelope names its key, so a key ring can rotate: new
// records use the first key of the ring, old ones keep opening with the
// key they name for as long as it stays in the ring.
package seal

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"golang.org/x/crypto/chacha20poly1305"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/rotated"
	"github.com/idem-extproc/idem-extproc/internal/safefile"
)

// ErrOpen is any failure to open an envelope: a key not in the ring, a
// damaged or tampered envelope, one moved to another record, an envelope
// version this server does not know.
var ErrOpen = errors.New("seal: stored response does not open")

// Envelope versions.
const (
	// versionAESGCM is AES-256-GCM under the ring's key, 12-byte random
	// nonce. Opened, never sealed.
	versionAESGCM = 1
	// versionXChaCha is XChaCha20-Poly1305 under a key derived from the
	// ring's key (xchachaKeyInfo), 24-byte random nonce.
	versionXChaCha = 2
)

// xchachaKeyInfo names the version-2 key derived from a ring key (HKDF,
// RFC 5869). The ring's 32 bytes stay the AES-256 key of version-1
// envelopes; deriving the other key keeps each key to one algorithm.
const xchachaKeyInfo = "idem-extproc seal v2 XChaCha20-Poly1305"

// maxPlaintext is the largest plaintext x/crypto's XChaCha20-Poly1305
// seals (its Seal panics beyond): 256 GiB less 64 bytes. Stored bodies are
// bounded far below (max_stored_body is at most 2 GiB); the check keeps a
// future caller from reaching the panic.
const maxPlaintext = 1<<38 - 64

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

// OnReload has f told the outcome of every reload of the file from now on
// (the daemon counts them).
func (r *Ring) OnReload(f func(err error)) { r.keys.OnReload(f) }

// keySet is what the ring file holds.
type keySet struct {
	active string
	keys   map[string]ringKey
}

// ringKey is one key of the ring, ready for each envelope version.
type ringKey struct {
	aesgcm  cipher.AEAD // opens version 1
	xchacha cipher.AEAD // seals and opens version 2
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

// maxRingFile caps the key ring file: a key is a line of about 100 bytes,
// and a ring holds a handful.
const maxRingFile = 64 << 10

func readRing(path string) (keySet, error) {
	b, err := safefile.Read(path, maxRingFile)
	if err != nil {
		return keySet{}, fmt.Errorf("seal: key ring: %w", err)
	}
	keys := map[string]ringKey{}
	active := ""
	n := 0
	for line := range strings.Lines(string(b)) {
		n++
		line = strings.TrimSpace(line)
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
		k, err := newRingKey(raw)
		if err != nil {
			return keySet{}, fmt.Errorf("seal: %s:%d: key %q: %w", path, n, kid, err)
		}
		keys[kid] = k
		if active == "" {
			active = kid
		}
	}
	if active == "" {
		return keySet{}, fmt.Errorf("seal: %s: no key", path)
	}
	return keySet{active: active, keys: keys}, nil
}

// newRingKey prepares a 32-byte ring key for both envelope versions. It
// fails where the process forbids an algorithm (GODEBUG=fips140=only
// refuses GCM with caller-chosen nonces and ChaCha20-Poly1305 alike).
func newRingKey(raw []byte) (ringKey, error) {
	block, err := aes.NewCipher(raw)
	if err != nil {
		return ringKey{}, err
	}
	gcm, err := cipher.NewGCM(block)
	if err != nil {
		return ringKey{}, err
	}
	sub, err := hkdf.Key(sha256.New, raw, nil, xchachaKeyInfo, chacha20poly1305.KeySize)
	if err != nil {
		return ringKey{}, err
	}
	x, err := chacha20poly1305.NewX(sub)
	if err != nil {
		return ringKey{}, err
	}
	return ringKey{aesgcm: gcm, xchacha: x}, nil
}

// current returns the keys in force, reloaded when the file changed
// (package rotated): a file that does not load leaves the ring as it was.
func (r *Ring) current() (string, map[string]ringKey) {
	ks := r.keys.Current()
	return ks.active, ks.keys
}

// ActiveKey names the key that seals.
func (r *Ring) ActiveKey() string {
	active, _ := r.current()
	return active
}

// aadV1 is version 1's associated data: the record id, status and
// flags (appendFlags).
func aadV1(id idem.RecordID, resp *idem.Response) []byte {
	b := make([]byte, 0, 64)
	b = append(b, "idem-extproc seal v1\x00"...)
	b = append(b, id...)
	b = binary.AppendUvarint(b, uint64(resp.Status))
	return appendFlags(b, resp)
}

// aadV2 is version 2's associated data: the envelope's header (version
// and key id), then the record id, status and flags (appendFlags).
func aadV2(header []byte, id idem.RecordID, resp *idem.Response) []byte {
	b := make([]byte, 0, 64+len(header))
	b = append(b, "idem-extproc seal v2\x00"...)
	b = append(b, header...)
	b = binary.AppendUvarint(b, uint64(len(id)))
	b = append(b, id...)
	b = binary.AppendUvarint(b, uint64(resp.Status))
	return appendFlags(b, resp)
}

// appendFlags binds the flags that say how to read the contents: bit 0
// body omitted, bit 1 compressed. An envelope sealed before compression
// existed has bit 1 clear and its byte is unchanged (0 or 1), so it still
// opens; a compressed flag set or cleared in the store by someone without
// the key makes the envelope fail to open instead of replaying a frame as
// a body, or a body as a frame.
func appendFlags(b []byte, resp *idem.Response) []byte {
	var f byte
	if resp.BodyOmitted {
		f |= 1
	}
	if resp.Compressed {
		f |= 2
	}
	return append(b, f)
}

// Seal encrypts resp's headers and body for the record id, in a version-2
// envelope under the ring's first key.
func (r *Ring) Seal(id idem.RecordID, resp idem.Response) (idem.Response, error) {
	if resp.Sealed {
		return resp, nil
	}
	kid, keys := r.current()
	aead := keys[kid].xchacha
	plain := encodeContents(resp)
	if uint64(len(plain)) > maxPlaintext {
		return idem.Response{}, fmt.Errorf("seal: response of %d bytes is too large to seal", len(plain))
	}
	env := make([]byte, 0, 2+len(kid)+aead.NonceSize()+len(plain)+aead.Overhead())
	env = append(env, versionXChaCha, byte(len(kid)))
	env = append(env, kid...)
	header := env
	nonce := env[len(env) : len(env)+aead.NonceSize()]
	if _, err := rand.Read(nonce); err != nil {
		return idem.Response{}, fmt.Errorf("seal: nonce: %w", err)
	}
	env = env[:len(env)+aead.NonceSize()]
	out := idem.Response{Status: resp.Status, BodyOmitted: resp.BodyOmitted, Compressed: resp.Compressed, Sealed: true}
	out.Body = aead.Seal(env, nonce, plain, aadV2(header, id, &out))
	return out, nil
}

// Open decrypts a sealed response of the record id, in an envelope of
// either version. An unsealed response is returned as it is.
func (r *Ring) Open(id idem.RecordID, resp idem.Response) (idem.Response, error) {
	if !resp.Sealed {
		return resp, nil
	}
	env := resp.Body
	if len(env) == 0 {
		return idem.Response{}, fmt.Errorf("%w: empty envelope", ErrOpen)
	}
	if v := env[0]; v != versionAESGCM && v != versionXChaCha {
		return idem.Response{}, fmt.Errorf("%w: unknown envelope version %d (this server opens versions %d and %d)",
			ErrOpen, v, versionAESGCM, versionXChaCha)
	}
	if len(env) < 2 || len(env) < 2+int(env[1]) {
		return idem.Response{}, fmt.Errorf("%w: truncated envelope: %d bytes end inside its header", ErrOpen, len(env))
	}
	header := env[:2+int(env[1])]
	kid := string(header[2:])
	_, keys := r.current()
	key, ok := keys[kid]
	if !ok {
		return idem.Response{}, fmt.Errorf("%w: key %q is not in the ring", ErrOpen, kid)
	}
	var aead cipher.AEAD
	var ad []byte
	if env[0] == versionAESGCM {
		aead, ad = key.aesgcm, aadV1(id, &resp)
	} else {
		aead, ad = key.xchacha, aadV2(header, id, &resp)
	}
	rest := env[len(header):]
	if len(rest) < aead.NonceSize()+aead.Overhead() {
		return idem.Response{}, fmt.Errorf("%w: truncated envelope: version %d needs at least %d bytes after its header, has %d",
			ErrOpen, env[0], aead.NonceSize()+aead.Overhead(), len(rest))
	}
	plain, err := aead.Open(nil, rest[:aead.NonceSize()], rest[aead.NonceSize():], ad)
	if err != nil {
		return idem.Response{}, fmt.Errorf("%w: authentication failed (version %d, key %q)", ErrOpen, env[0], kid)
	}
	out, err := decodeContents(plain)
	if err != nil {
		return idem.Response{}, fmt.Errorf("%w: %w", ErrOpen, err)
	}
	out.Status, out.BodyOmitted, out.Compressed = resp.Status, resp.BodyOmitted, resp.Compressed
	return out, nil
}

// encodeContents is what an envelope encrypts, the same in every version
// (idem.AppendContents).
func encodeContents(resp idem.Response) []byte {
	return idem.AppendContents(make([]byte, 0, idem.ContentsSize(&resp)), &resp)
}

// decodeContents reverses encodeContents. Only authenticated plaintext
// reaches it, yet idem.ParseContents checks every length: a key that
// leaked lets anyone seal anything.
func decodeContents(plain []byte) (idem.Response, error) {
	return idem.ParseContents(plain)
}
