// Package filekinds puts, where a test's server expects a file, each kind
// of file an operator could point it at by mistake or an attacker on
// purpose: a regular file, an empty one, one past the reader's size cap, a
// FIFO, a symbolic link to /dev/zero, a directory, a Unix socket, and a
// symbolic link to a secret that is not valid for the role. Each file role's
// tests run the whole table through their own reader.
package filekinds

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/testing/testwait"
)

// Kind is one kind of file.
type Kind string

// The kinds Make puts in place.
const (
	Regular   Kind = "regular"
	Empty     Kind = "empty"
	TooBig    Kind = "too big"
	FIFO      Kind = "FIFO"
	DevZero   Kind = "symlink to /dev/zero"
	Directory Kind = "directory"
	Socket    Kind = "unix socket"
	Secret    Kind = "symlink to a secret"
)

// All lists every kind, Regular first.
func All() []Kind {
	return []Kind{Regular, Empty, TooBig, FIFO, DevZero, Directory, Socket, Secret}
}

// SecretMark is in the secret that Secret links to; no error or log line
// may hold it.
const SecretMark = "s3cr3t-Zq8"

// SecretContent is the secret file: a line of /etc/shadow's form, which
// reads as YAML: a mapping whose one key is the whole line.
const SecretContent = "root:$6$" + SecretMark + ":19000:0:99999:7:::\n"

// Make puts a file of kind k at path. valid is what a regular file of the
// role holds; TooBig is valid followed by newlines (which no role's format
// minds) up to limit+1 bytes.
func Make(t testing.TB, k Kind, path string, valid []byte, limit int64) {
	t.Helper()
	var err error
	switch k {
	case Regular:
		err = os.WriteFile(path, valid, 0o600)
	case Empty:
		err = os.WriteFile(path, nil, 0o600)
	case TooBig:
		pad := bytes.Repeat([]byte("\n"), int(limit+1)-len(valid))
		err = os.WriteFile(path, append(append([]byte(nil), valid...), pad...), 0o600)
	case FIFO:
		err = syscall.Mkfifo(path, 0o600)
	case DevZero:
		err = os.Symlink("/dev/zero", path)
	case Directory:
		err = os.Mkdir(path, 0o700)
	case Socket:
		err = listenUnix(t, path)
	case Secret:
		secret := filepath.Join(t.TempDir(), "shadow")
		if err = os.WriteFile(secret, []byte(SecretContent), 0o600); err == nil {
			err = os.Symlink(secret, path)
		}
	default:
		t.Fatalf("filekinds: unknown kind %q", k)
	}
	if err != nil {
		t.Fatalf("filekinds: %s at %s: %v", k, path, err)
	}
}

// Replace puts a file of kind k where the file path is: the new file is
// made beside it and renamed over it once the old one is gone (a
// directory cannot be renamed over a file).
func Replace(t testing.TB, k Kind, path string, valid []byte, limit int64) {
	t.Helper()
	tmp := path + ".new"
	Make(t, k, tmp, valid, limit)
	if err := os.Remove(path); err != nil {
		t.Fatalf("filekinds: %v", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatalf("filekinds: rename %s: %v", tmp, err)
	}
}

// listenUnix binds a Unix socket at path, or, when path is longer than a
// socket address holds (unix(7): 108 bytes with the NUL), in a short
// directory with path a symbolic link to it.
func listenUnix(t testing.TB, path string) error {
	at := path
	if len(path) > 100 {
		dir, err := os.MkdirTemp("", "fk")
		if err != nil {
			return err
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		at = filepath.Join(dir, "s")
		if err := os.Symlink(at, path); err != nil {
			return err
		}
	}
	l, err := net.Listen("unix", at)
	if err != nil {
		return err
	}
	t.Cleanup(func() { l.Close() })
	return nil
}

// Returns runs f, failing the test if it has not returned before a
// context of testwait.Bound ends: a read that blocks (a FIFO) or never
// ends (/dev/zero) is a failure, not a hung test binary.
func Returns(t testing.TB, what string, f func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testwait.Bound)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatalf("%s: did not return within %v (blocked on the file, or reading without end)", what, testwait.Bound)
	}
}
