package config

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/testing/filekinds"
)

// validPolicies is a policy file every kind of file replaces in the tests.
const validPolicies = "policies: []\n"

// refusedAs is what the error says of each kind of policy or dictionary
// file that is not the regular file of the table: its kind, or why its
// contents are refused (each without its bytes).
var refusedAs = map[filekinds.Kind]string{
	filekinds.Empty:     "empty",
	filekinds.TooBig:    "larger than",
	filekinds.FIFO:      "a FIFO",
	filekinds.DevZero:   "a character device",
	filekinds.Directory: "a directory",
	filekinds.Socket:    "a socket",
	filekinds.Secret:    "unknown field",
}

// checkRefusal fails the test unless err refuses kind k as refusedAs says,
// names path, and holds nothing of the secret.
func checkRefusal(t *testing.T, k filekinds.Kind, path string, err error) {
	t.Helper()
	if k == filekinds.Regular {
		if err != nil {
			t.Fatalf("regular file refused: %v", err)
		}
		return
	}
	if err == nil {
		t.Fatalf("%s accepted", k)
	}
	if msg := err.Error(); !strings.Contains(msg, refusedAs[k]) || !strings.Contains(msg, path) ||
		strings.Contains(msg, filekinds.SecretMark) {
		t.Fatalf("error %q: want it to name %s and say %q, without the file's contents", msg, path, refusedAs[k])
	}
}

// TestPolicyFileKindsAtStart: a server starts on a regular policy file
// only; every other kind is refused at start, without blocking and
// without quoting what the file holds.
func TestPolicyFileKindsAtStart(t *testing.T) {
	for _, k := range filekinds.All() {
		t.Run(string(k), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "policies.yaml")
			filekinds.Make(t, k, path, []byte(validPolicies), maxPolicyFile)
			var err error
			filekinds.Returns(t, "NewSource", func() { _, err = NewSource(path, slog.New(slog.DiscardHandler), nil) })
			checkRefusal(t, k, path, err)
			filekinds.Returns(t, "Load", func() { _, err = Load(path) })
			checkRefusal(t, k, path, err)
		})
	}
}

// TestPolicyFileKindsOnReload: a policy file replaced by any kind of file
// but a valid regular one is a rejected reload, logged without the file's
// contents and reported to OnReload (which the daemon counts), and the
// policies in force stay; the next valid file is put in force as usual.
func TestPolicyFileKindsOnReload(t *testing.T) {
	for _, k := range filekinds.All() {
		t.Run(string(k), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "policies.yaml")
			if err := os.WriteFile(path, []byte("policies: []\ndefault_policy: {enabled: true}\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			var log bytes.Buffer
			s, err := NewSource(path, slog.New(slog.NewTextHandler(&log, nil)), nil)
			if err != nil {
				t.Fatal(err)
			}
			s.Settle = 0
			before := s.Current()
			var told []error
			s.OnReload = func(err error) { told = append(told, err) }
			filekinds.Replace(t, k, path, []byte(validPolicies), maxPolicyFile)
			filekinds.Returns(t, "Reload", func() { err = s.Reload() })
			checkRefusal(t, k, path, err)
			if len(told) != 1 || told[0] != err {
				t.Fatalf("OnReload told %v, want the reload's error once", told)
			}
			if k == filekinds.Regular {
				if s.Current() == before {
					t.Fatal("a valid file was not put in force")
				}
				return
			}
			if s.Current() != before {
				t.Fatal("a refused file replaced the policies in force")
			}
			if !strings.Contains(log.String(), "reload rejected") || strings.Contains(log.String(), filekinds.SecretMark) {
				t.Fatalf("log %q: want the rejection, without the file's contents", log.String())
			}
			filekinds.Replace(t, filekinds.Regular, path, []byte(validPolicies), maxPolicyFile)
			filekinds.Returns(t, "the next Reload", func() { err = s.Reload() })
			if err != nil || s.Current() == before || len(told) != 2 {
				t.Fatalf("the next valid file: Reload = %v, told %v; want it in force", err, told)
			}
		})
	}
}

// TestDictionaryFileKinds: a compression dictionary is read like the
// policy file that names it: a regular file of at most maxDictionaryFile
// bytes, or a mistake at the line that names it.
func TestDictionaryFileKinds(t *testing.T) {
	valid, err := os.ReadFile("testdata/orders-40001.zdict")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range filekinds.All() {
		t.Run(string(k), func(t *testing.T) {
			dir := t.TempDir()
			dict := filepath.Join(dir, "d.zdict")
			filekinds.Make(t, k, dict, valid, maxDictionaryFile)
			doc := "defaults:\n  compression:\n    dictionary: d.zdict\npolicies: []\n"
			var err error
			filekinds.Returns(t, "Parse", func() { _, err = Parse(filepath.Join(dir, "policies.yaml"), []byte(doc)) })
			if k == filekinds.Empty || k == filekinds.Secret {
				// A regular file, refused for what it holds.
				if err == nil || !strings.Contains(err.Error(), "not a zstd dictionary") || strings.Contains(err.Error(), filekinds.SecretMark) {
					t.Fatalf("Parse = %v, want not a zstd dictionary, without its contents", err)
				}
				return
			}
			checkRefusal(t, k, dict, err)
		})
	}
}

// TestErrorsHideContents: a file that is not a policy file at all (a
// secret, a key, a shadow file) is refused naming its lines and fields,
// never quoting its keys or values.
func TestErrorsHideContents(t *testing.T) {
	const s = filekinds.SecretMark
	for _, doc := range []string{
		filekinds.SecretContent,
		"root:$6$" + s + ":19000:0:99999:7:::\n",
		"-----BEGIN PRIVATE KEY-----\n" + s + "\n-----END PRIVATE KEY-----\n",
		s + "\n",
		"\"" + s + "\ttab\": 1\n",
		"policies:\n- match: {methods: [POST]}\n  " + s + "$: 1\n",
		"policies: [*" + s + "]\n",
		"a: 1\na: " + s + "\n" + s + ": 1\n" + s + ": 2\n",
		"policies: !" + s + " 3\n",
	} {
		_, err := Parse("p.yaml", []byte(doc))
		if err == nil || strings.Contains(err.Error(), s) {
			t.Errorf("Parse(%q) = %v, want an error without the contents", doc, err)
		}
	}
}
