package extprocwire

import (
	"bytes"
	"crypto/sha256"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

var updateCorpus = flag.Bool("update-corpus", false, "rewrite the fuzz seed corpora in testdata/fuzz from the table cases")

// checkRequest is the decoder's differential check: for any bytes,
// UnmarshalRequest accepts iff proto.Unmarshal does, and then yields a
// proto.Equal message that does not alias data.
func checkRequest(t *testing.T, data []byte) {
	t.Helper()
	want := new(extprocv3.ProcessingRequest)
	wantErr := proto.Unmarshal(data, want)
	in := bytes.Clone(data)
	got := new(extprocv3.ProcessingRequest)
	gotErr := unmarshalRequest(in, got)
	if (wantErr == nil) != (gotErr == nil) {
		t.Fatalf("proto.Unmarshal: %v, UnmarshalRequest: %v (input %x)", wantErr, gotErr, short(data))
	}
	if wantErr != nil {
		return
	}
	if !proto.Equal(want, got) {
		t.Fatalf("messages differ for input %x:\nproto: %v\nfast:  %v", short(data), want, got)
	}
	for i := range in {
		in[i] ^= 0xff
	}
	if !proto.Equal(want, got) {
		t.Fatalf("the decoded message changed with its input: it aliases it (input %x)", short(data))
	}
}

// checkResponse is the encoder's differential check: MarshalResponse errs
// iff proto.Marshal does, its bytes read back with proto.Unmarshal equal
// m, and their length is proto.Size(m).
func checkResponse(t *testing.T, m *extprocv3.ProcessingResponse) {
	t.Helper()
	_, wantErr := proto.Marshal(m)
	e := encoder{}
	if n, ok := e.response(m); ok {
		if b, err := e.appendResponse(nil, m); err == nil && len(b) != n {
			t.Fatalf("fast size %d, fast encoding %d bytes (message %v)", n, len(b), m)
		}
	}
	b, err := marshalResponse(m)
	if (wantErr == nil) != (err == nil) {
		t.Fatalf("proto.Marshal: %v, MarshalResponse: %v (message %v)", wantErr, err, m)
	}
	if err != nil {
		return
	}
	// The codec writes the same bytes, whichever buffer holds them.
	data, err := NewCodec().Marshal(m)
	if err != nil {
		t.Fatalf("Codec.Marshal: %v, MarshalResponse none (message %v)", err, m)
	}
	if got := data.Materialize(); !bytes.Equal(got, b) {
		t.Fatalf("Codec.Marshal wrote %x, MarshalResponse %x", got, b)
	}
	data.Free()
	back := new(extprocv3.ProcessingResponse)
	if err := proto.Unmarshal(b, back); err != nil {
		t.Fatalf("proto.Unmarshal of the fast encoding: %v (message %v, bytes %x)", err, m, b)
	}
	if !proto.Equal(m, back) {
		t.Fatalf("round trip differs:\nsent: %v\ngot:  %v", m, back)
	}
	if n := (proto.MarshalOptions{}).Size(m); len(b) != n {
		t.Fatalf("fast encoding is %d bytes, proto.Size %d (message %v)", len(b), n, m)
	}
}

// short is data cut to a readable length for a failure message.
func short(data []byte) []byte {
	if len(data) > 64 {
		return data[:64]
	}
	return data
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func requestSeeds() [][]byte {
	var seeds [][]byte
	cases := requestCases()
	for _, k := range sortedKeys(cases) {
		seeds = append(seeds, mustMarshal(cases[k]))
	}
	tricky := trickyRequests()
	for _, k := range sortedKeys(tricky) {
		seeds = append(seeds, tricky[k])
	}
	return seeds
}

func responseSeeds() [][]byte {
	var seeds [][]byte
	cases := responseCases()
	for _, k := range sortedKeys(cases) {
		seeds = append(seeds, mustMarshal(cases[k]))
	}
	return seeds
}

// FuzzUnmarshalRequest holds the hand-written decoder to proto.Unmarshal
// for any input. Its seeds (testdata/fuzz/FuzzUnmarshalRequest, the table
// cases) run with every go test.
func FuzzUnmarshalRequest(f *testing.F) {
	for _, s := range requestSeeds() {
		f.Add(s)
	}
	f.Fuzz(checkRequest)
}

// FuzzMarshalResponse holds the hand-written encoder to proto.Marshal for
// any ProcessingResponse proto.Unmarshal makes of the input.
func FuzzMarshalResponse(f *testing.F) {
	for _, s := range responseSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m := new(extprocv3.ProcessingResponse)
		if proto.Unmarshal(data, m) != nil {
			return
		}
		checkResponse(t, m)
	})
}

// TestSeedCorpus keeps testdata/fuzz in step with the table cases
// (go test -run TestSeedCorpus -update-corpus rewrites it).
func TestSeedCorpus(t *testing.T) {
	for name, seeds := range map[string][][]byte{"FuzzUnmarshalRequest": requestSeeds(), "FuzzMarshalResponse": responseSeeds()} {
		dir := filepath.Join("testdata", "fuzz", name)
		if *updateCorpus {
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			for _, s := range seeds {
				body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", s)
				sum := sha256.Sum256(s) // named by content, as go test -fuzz names what it finds
				if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%x", sum[:8])), []byte(body), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) < len(seeds) {
			t.Errorf("%s: %d corpus files for %d table seeds; run go test -run TestSeedCorpus -update-corpus", dir, len(entries), len(seeds))
		}
	}
}

func TestRequestsAgreeWithProto(t *testing.T) {
	for name, data := range trickyRequests() {
		t.Run(name, func(t *testing.T) { checkRequest(t, data) })
	}
	for name, m := range requestCases() {
		t.Run(name, func(t *testing.T) { checkRequest(t, mustMarshal(m)) })
	}
}

// TestFastPathTakesEnvoysMessages: the messages Envoy sends are decoded
// and encoded by the hand-written paths, not by the fallback (else the
// differential tests above would prove nothing about them).
func TestFastPathTakesEnvoysMessages(t *testing.T) {
	for name, m := range requestCases() {
		own := mustMarshal(m)
		d := decoder{own: own}
		got := new(extprocv3.ProcessingRequest)
		if !d.request(own, got) {
			t.Errorf("%s: the fast decoder fell back", name)
		} else if !proto.Equal(m, got) {
			t.Errorf("%s: decoded %v, want %v", name, got, m)
		}
	}
	attrs := mustMarshal(typicalRequestHeaders().GetAttributes()["envoy.filters.http.ext_proc"])
	if d := (decoder{own: attrs}); !d.flatStruct(attrs, new(structpb.Struct)) {
		t.Errorf("the attributes Struct was left to proto")
	}
	for name, m := range responseCases() {
		e := encoder{}
		n, ok := e.response(m)
		if !ok {
			t.Errorf("%s: the fast encoder fell back", name)
			continue
		}
		b, err := e.appendResponse(make([]byte, 0, n), m)
		if err != nil || len(b) != n {
			t.Errorf("%s: %d bytes for a size of %d, error %v", name, len(b), n, err)
		}
		if m.DynamicMetadata == nil { // no map: proto's deterministic bytes
			if want := mustMarshal(m); !bytes.Equal(b, want) {
				t.Errorf("%s: %x, proto.Marshal %x", name, b, want)
			}
		}
	}
	for name, m := range fallbackResponses() {
		if _, ok := (&encoder{}).response(m); ok && name != "invalid UTF-8 in a Struct" {
			t.Errorf("%s: the fast encoder took it", name)
		}
	}
}

func TestResponsesAgreeWithProto(t *testing.T) {
	for name, m := range responseCases() {
		t.Run(name, func(t *testing.T) { checkResponse(t, m) })
	}
	for name, m := range fallbackResponses() {
		t.Run(name, func(t *testing.T) { checkResponse(t, m) })
	}
}
