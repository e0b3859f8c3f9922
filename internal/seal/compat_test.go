package seal

import (
	"encoding/hex"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// vectorKey is the key the fixed envelopes below were sealed with: the
// bytes 0, 1, …, 31. It appears in the ring under the id each envelope
// names.
const vectorKey = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="

// fixedEnvelopes are kept byte for byte: records already in a store must
// keep opening, whatever changes in the code that seals. The version-1
// envelopes were sealed by the AES-256-GCM code path before version 2
// existed; the version-2 ones by the XChaCha20-Poly1305 path.
var fixedEnvelopes = []struct {
	name     string
	sealed   idem.Response
	want     idem.Response
	envelope string
}{
	{
		name:   "version 1, headers and body",
		sealed: idem.Response{Status: 201, Sealed: true},
		want: idem.Response{Status: 201, Headers: []idem.Header{{Name: "content-type", Value: "application/json"}, {Name: "x-dup", Value: ""}},
			Body: []byte(`{"card":"4111 1111 1111 1111"}`)},
		envelope: "010676312d6b65796245b4694df498c1fefcbc2b57cb6997885031ce08cc434ac65d8366a27ea2210b6bdbc016fb1834f09eeb45e9fa5adcad610f412eafdfe9752d4300a636bd26861c9047a65d8eaef7c2cce5a79b60dc475d998614ab4bcb095ae3a1f3efc1e8",
	},
	{
		name:     "version 1, headers only, body omitted",
		sealed:   idem.Response{Status: 200, BodyOmitted: true, Sealed: true},
		want:     idem.Response{Status: 200, Headers: []idem.Header{{Name: "etag", Value: `"x"`}}, BodyOmitted: true},
		envelope: "010676312d6b657916f19f10f2cefd395aafb42a4fc22c1ccc12d2159f79fabd7bb9106260abf7d0a6ff1b4026c5",
	},
	{
		name:   "version 2, headers and body",
		sealed: idem.Response{Status: 201, Sealed: true},
		want: idem.Response{Status: 201, Headers: []idem.Header{{Name: "content-type", Value: "application/json"}, {Name: "x-dup", Value: ""}},
			Body: []byte(`{"card":"4111 1111 1111 1111"}`)},
		envelope: "020676322d6b6579ba13f52f6ca53fce33af9d5dbc6493445faf1952d020ca5deb8c28e9417ce63020799aa5ce448d12360cf2d256c2b33ad78786d3238640d23753667f9c635423de54e97478b3f625c63e83a98e1aaf835cfed07954995ce637a7bc75e7bd21ba23c77998734769fb7fb3a8bf",
	},
	{
		name:     "version 2, headers only, body omitted",
		sealed:   idem.Response{Status: 200, BodyOmitted: true, Sealed: true},
		want:     idem.Response{Status: 200, Headers: []idem.Header{{Name: "etag", Value: `"x"`}}, BodyOmitted: true},
		envelope: "020676322d6b65792e19ae6e0b41c93571238b35201de65b55e4b7b7dae29953601b6172741617f990096982314d6087b243dfa4a0c4d1b26c4f",
	},
}

// TestFixedEnvelopesOpen: envelopes of every version, among them those
// sealed by the AES-256-GCM code path, open with the key they name while a
// newer key seals.
func TestFixedEnvelopesOpen(t *testing.T) {
	r, _ := ring(t, "new-key "+key(t), "v1-key "+vectorKey, "v2-key "+vectorKey)
	id := idem.RecordIDFor("payments", "api.example.com:443", "vector-1")
	for _, v := range fixedEnvelopes {
		t.Run(v.name, func(t *testing.T) {
			sealed := v.sealed
			sealed.Body = fixedEnvelope(t, v.envelope)
			got, err := r.Open(id, sealed)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			if !sameResponse(got, v.want) {
				t.Fatalf("opened %+v, want %+v", got, v.want)
			}
			// Bound to its record like any envelope.
			if _, err := r.Open(idem.RecordIDFor("payments", "api.example.com:443", "vector-2"), sealed); err == nil {
				t.Fatal("the envelope opened under another record")
			}
		})
	}
}

func fixedEnvelope(t testing.TB, h string) []byte {
	t.Helper()
	b, err := hex.DecodeString(h)
	if err != nil {
		t.Fatal(err)
	}
	return b
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
