package seal

import (
	"encoding/hex"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// version1Key is the key the version-1 envelopes below were sealed with:
// the bytes 0, 1, …, 31.
const version1Key = "v1-key AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="

// version1Envelopes were sealed by the AES-256-GCM code path (envelope
// version 1) and are kept byte for byte: records sealed before a change of
// envelope must keep opening until they expire.
var version1Envelopes = []struct {
	name     string
	sealed   idem.Response
	want     idem.Response
	envelope string
}{
	{
		name:   "headers and body",
		sealed: idem.Response{Status: 201, Sealed: true},
		want: idem.Response{Status: 201, Headers: []idem.Header{{Name: "content-type", Value: "application/json"}, {Name: "x-dup", Value: ""}},
			Body: []byte(`{"card":"4111 1111 1111 1111"}`)},
		envelope: "010676312d6b65796245b4694df498c1fefcbc2b57cb6997885031ce08cc434ac65d8366a27ea2210b6bdbc016fb1834f09eeb45e9fa5adcad610f412eafdfe9752d4300a636bd26861c9047a65d8eaef7c2cce5a79b60dc475d998614ab4bcb095ae3a1f3efc1e8",
	},
	{
		name:     "headers only, body omitted",
		sealed:   idem.Response{Status: 200, BodyOmitted: true, Sealed: true},
		want:     idem.Response{Status: 200, Headers: []idem.Header{{Name: "etag", Value: `"x"`}}, BodyOmitted: true},
		envelope: "010676312d6b657916f19f10f2cefd395aafb42a4fc22c1ccc12d2159f79fabd7bb9106260abf7d0a6ff1b4026c5",
	},
}

// TestVersion1EnvelopesOpen: envelopes sealed by the AES-256-GCM code path
// open with the key they name.
func TestVersion1EnvelopesOpen(t *testing.T) {
	r, _ := ring(t, "new-key "+key(t), version1Key)
	id := idem.RecordIDFor("payments", "api.example.com:443", "vector-1")
	for _, v := range version1Envelopes {
		t.Run(v.name, func(t *testing.T) {
			env, err := hex.DecodeString(v.envelope)
			if err != nil {
				t.Fatal(err)
			}
			sealed := v.sealed
			sealed.Body = env
			got, err := r.Open(id, sealed)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			if !sameResponse(got, v.want) {
				t.Fatalf("opened %+v, want %+v", got, v.want)
			}
			// Bound to its record like any envelope.
			if _, err := r.Open(idem.RecordIDFor("payments", "api.example.com:443", "vector-2"), sealed); err == nil {
				t.Fatal("a version-1 envelope opened under another record")
			}
		})
	}
}

func sameResponse(a, b idem.Response) bool {
	if a.Status != b.Status || a.BodyOmitted != b.BodyOmitted || a.Sealed != b.Sealed ||
		string(a.Body) != string(b.Body) || len(a.Headers) != len(b.Headers) {
		return false
	}
	for i := range a.Headers {
		if a.Headers[i] != b.Headers[i] {
			return false
		}
	}
	return true
}
