package idemclient

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/google/uuid"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// KeyHeader is the request header that carries the operation key
// (draft-ietf-httpapi-idempotency-key-header), spelled as the server
// spells it; header names compare case-insensitively (net/http's
// Header.Get and Header.Set).
const KeyHeader = idem.KeyHeader

// ErrInvalidKey reports a key the server would refuse with 400
// idempotency-key-invalid; the request is not sent.
var ErrInvalidKey = errors.New("idemclient: invalid Idempotency-Key")

// NewKey returns a fresh operation key: a UUIDv7 (time-ordered, so keys of
// one client sort by creation), or a UUIDv4 should the v7 generator fail.
func NewKey() string {
	if u, err := uuid.NewV7(); err == nil {
		return u.String()
	}
	return uuid.NewString()
}

// SetKey gives r the operation key key, in the quoted form the IETF draft
// defines (a Structured Field string). A key the server would refuse (empty,
// longer than 255 characters, not visible ASCII) is an ErrInvalidKey.
func SetKey(r *http.Request, key string) error {
	if _, err := idem.ParseKey(quoteKey(key), 0); err != nil {
		return fmt.Errorf("%w: %q", ErrInvalidKey, key)
	}
	if r.Header == nil {
		r.Header = http.Header{}
	}
	r.Header.Set(KeyHeader, quoteKey(key))
	return nil
}

// Key returns r's operation key without its quotes, or "" when r has none
// or a malformed one. It works on a response's Request too, which is the
// last attempt the transport sent. It reads the Idempotency-Key header;
// with Options.KeyHeader set, read that header.
func Key(r *http.Request) string {
	if r == nil {
		return ""
	}
	k, _ := parseKey(r.Header, KeyHeader)
	return k
}

// parseKey reads the key header in either form the server accepts (the
// quoted sf-string or a bare token), with the server's own parser, so that
// the client refuses exactly what the server would. It returns "" and no
// error when there is no key header.
func parseKey(h http.Header, name string) (string, error) {
	vals := h.Values(name)
	switch len(vals) {
	case 0:
		return "", nil
	case 1:
	default:
		return "", fmt.Errorf("%w: %d %s headers", ErrInvalidKey, len(vals), name)
	}
	k, err := idem.ParseKey(vals[0], 0)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrInvalidKey, err)
	}
	return k, nil
}

// quoteKey serialises key as an RFC 8941 sf-string: in quotes, with " and \
// escaped.
func quoteKey(key string) string {
	var b strings.Builder
	b.Grow(len(key) + 2)
	b.WriteByte('"')
	for i := 0; i < len(key); i++ {
		if c := key[i]; c == '"' || c == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(key[i])
	}
	b.WriteByte('"')
	return b.String()
}

// NewRequest returns a request for one new operation: a fresh key (NewKey)
// and a body that can be sent again (GetBody set), so the transport may
// retry it. Keep the request, or its key (Key), to ask about the same
// operation later; build a new request for a new operation.
func NewRequest(ctx context.Context, method, url string, body []byte) (*http.Request, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body) // http.NewRequest sets GetBody for a *bytes.Reader
	}
	r, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return nil, err
	}
	r.Header.Set(KeyHeader, quoteKey(NewKey()))
	return r, nil
}
