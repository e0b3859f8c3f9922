package idem

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"time"
)

// State is where a record is in its life.
type State uint8

const (
	// StateInFlight: one attempt holds the reservation and the upstream call
	// may be running. Its lease says until when the holder vouches for it.
	StateInFlight State = iota + 1
	// StateCompleted: the upstream answered and the answer is stored.
	StateCompleted
	// StateUnknown: the effect may or may not have happened.
	StateUnknown
	// StateMoved: the key is arbitrated in another region's store now
	// (Record.Home). The record is the tombstone a hand-over left
	// (Reservation.HandOverTo) where the key's scope used to live, so that
	// a reservation arriving here from a server that still holds the older
	// map is sent on instead of running the operation a second time.
	StateMoved
)

func (s State) String() string {
	return EnumName(s, "invalid", "in_flight", "completed", "unknown", "moved")
}

// Fingerprint identifies an operation's request (see package fingerprint).
type Fingerprint [sha256.Size]byte

// Token names one reservation. It is random so that no attempt can forge
// another's.
type Token [16]byte

// NewToken returns a fresh random token.
func NewToken() Token {
	var t Token
	// crypto/rand.Read never returns an error on supported platforms.
	_, _ = rand.Read(t[:])
	return t
}

// String returns the token in hex, for logs and admin output.
func (t Token) String() string { return hex.EncodeToString(t[:]) }

// RecordID is the store-side name of a record: a hash of (policy, scope,
// key). It is short, fixed in length and does not reveal the client's key.
type RecordID string

// RecordIDFor derives the record id for an operation key within a policy and
// a scope. Each part is length-prefixed, so no two distinct triples collide
// by concatenation ("a"+"bc" versus "ab"+"c").
func RecordIDFor(policy, scope, key string) RecordID {
	// Encoded on the stack and hashed in one call: this runs for every
	// protected request.
	var buf [256]byte
	b := buf[:0]
	for _, part := range [...]string{policy, scope, key} {
		b = binary.AppendUvarint(b, uint64(len(part)))
		b = append(b, part...)
	}
	sum := sha256.Sum256(b)
	// 128 bits are ample against accidental collisions and keep keys short.
	var id [32]byte
	hex.Encode(id[:], sum[:16])
	return RecordID(id[:])
}

// Header is one response header as stored and replayed. Order and
// duplicates are kept, so a replay is byte-identical.
type Header struct {
	Name  string
	Value string
}

// FirstHeader returns the value of the first of hs named name, and whether
// there is one.
func FirstHeader(hs []Header, name string) (string, bool) {
	for _, h := range hs {
		if h.Name == name {
			return h.Value, true
		}
	}
	return "", false
}

// Response is what a completed record stores.
type Response struct {
	Status  int
	Headers []Header
	// Body is the stored body. It is empty when BodyOmitted is set.
	Body []byte
	// BodyOmitted records that the upstream answered but the body was not
	// kept: it exceeded the policy's limit or never arrived whole.
	BodyOmitted bool
	// Sealed says Body holds the headers and body encrypted together (see
	// package seal) and Headers is empty. Status stays readable.
	Sealed bool
	// Compressed says the headers and body were compressed together (see
	// package compress) before any sealing: Body, once opened, holds the
	// compressed frame and Headers is empty. A replay expands it back to
	// the bytes the upstream sent.
	Compressed bool
}

// Record is a stored record as Get returns it.
type Record struct {
	State       State
	Fingerprint Fingerprint
	Token       Token
	// LeaseUntil is the end of an in-flight record's lease.
	LeaseUntil time.Time
	CreatedAt  time.Time
	// Attempts counts the attempts of this operation that reached the
	// store: 1 for the first, n for the n-th.
	Attempts int
	// Response is set for completed records.
	Response *Response
	// Home is the region a moved record's key is arbitrated in now.
	Home string
}
