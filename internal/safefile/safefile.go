// Package safefile reads the files an operator points the server at (the
// policy file and its dictionaries, secrets, key rings, TLS material) so
// that no file can hang the server or make it grow: only a regular file is
// read, and only up to a size its caller sets. A FIFO would block the
// reader until someone writes to it, a device such as /dev/zero never
// ends, a directory or a socket is not a file at all; each is refused with
// its path and kind, and the reload that asked keeps what it had.
package safefile

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
)

// Read returns the contents of the regular file at path (a symbolic link
// is followed; its target must be a regular file), refusing a file larger
// than limit bytes. Errors name the path, never the contents.
func Read(path string, limit int64) ([]byte, error) {
	// Look before opening: opening a device can act on it (a watchdog, a
	// tape), and opening a FIFO for reading blocks until a writer comes.
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if err := check(path, fi, limit); err != nil {
		return nil, err
	}
	// O_NONBLOCK: should the path change into a FIFO between the look and
	// the open, the open returns at once instead of waiting for a writer
	// (fifo(7): "opening for read-only succeeds even if no one has opened
	// on the write side yet"); open(2) says the flag "has no effect for
	// regular files and block devices".
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	// What was opened is what counts: stat the descriptor, not the path.
	if fi, err = f.Stat(); err != nil {
		return nil, err
	}
	if err := check(path, fi, limit); err != nil {
		return nil, err
	}
	// One byte past the limit tells a file that grew since fstat.
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if int64(len(b)) > limit {
		return nil, tooLarge(path, limit)
	}
	return b, nil
}

// check refuses what is not a regular file of at most limit bytes.
func check(path string, fi fs.FileInfo, limit int64) error {
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s: %s, not a regular file; refused", path, kind(fi.Mode()))
	}
	if fi.Size() > limit {
		return tooLarge(path, limit)
	}
	return nil
}

func tooLarge(path string, limit int64) error {
	return fmt.Errorf("%s: larger than %s; refused", path, size(limit))
}

// kind names what a file that is not regular is.
func kind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO (named pipe)"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	}
	return "a special file (" + m.Type().String() + ")"
}

// size writes a limit as people read it.
func size(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}
