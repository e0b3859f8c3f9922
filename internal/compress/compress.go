// Package compress makes a stored response smaller before it is sealed
// and stored, and gives back, on a replay, the bytes the upstream sent.
//
// A compressed response holds its headers and body together
// (idem.AppendContents) in one frame, and Headers is empty:
//
//	format (1 byte) | zstd frame (RFC 8878)
//
// Format 2, which every new frame uses, is the frame without its 4-byte
// magic number, which is the same in every frame and is put back to
// expand it; format 1 is the whole frame, still expanded. Four bytes are
// worth it: a record's value is rounded up to the allocator's next size
// class, and with a trained dictionary most small answers sit near one.
//
// Headers go into the frame with the body since an API's headers repeat
// from one answer to the next, which a dictionary compresses to almost
// nothing. The zstd frame header names the dictionary its frame needs
// (RFC 8878 §3.1.1.1.3, Dictionary_ID), so a record keeps opening for as
// long as the server knows that dictionary: the built-in one (Builtin)
// always, a policy's trained ones while they stay in its configuration.
//
// Why zstd and not S2: on the answers of package corpus, zstd at its
// fastest level with the built-in dictionary takes a 1.4 KiB
// payment-intent answer to 0.45 of its size, and S2 to 0.53 with the same
// words and 0.80 without; on a 17 KiB list zstd reaches 0.22 and S2 0.30.
// S2 is the cheaper in CPU, but then a record's memory misses its targets
// (docs/performance.md, "Memory per stored answer").
package compress

import (
	"bytes"
	"errors"
	"fmt"
	"sync"

	"github.com/klauspost/compress/zstd"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// The first byte of a compressed body says what follows.
const (
	// formatZstd: a whole zstd frame. Expanded, never written since
	// formatZstdBare.
	formatZstd = 1
	// formatZstdBare: a zstd frame less its magic number (zstdMagic).
	formatZstdBare = 2
)

// zstdMagic starts every zstd frame (RFC 8878 §3.1.1, Magic_Number
// 0xFD2FB528, little-endian).
var zstdMagic = [4]byte{0x28, 0xb5, 0x2f, 0xfd}

// DefaultMinSize is the smallest response (headers and body as
// idem.ContentsSize counts them) worth compressing: below it a frame's own
// header and the CPU cost more than they save.
const DefaultMinSize = 128

// ErrExpand is any failure to expand a compressed response: a frame that
// names a dictionary the server does not have, a damaged frame, one that
// would expand past the limit, an unknown format.
var ErrExpand = errors.New("compress: stored response does not expand")

// Codec compresses and expands responses. It is safe for concurrent use.
//
// Its encoder and decoder are made at first use, so that a codec made and
// compared with another (a configuration parsed twice compares equal, see
// internal/config) holds nothing but its settings until then.
type Codec struct {
	minSize int
	// off: Compress leaves every response as it is.
	off bool
	// active is the dictionary new frames use.
	active *Dictionary
	// dicts are every dictionary the decoder knows, by id.
	dicts map[uint32]*Dictionary

	once sync.Once
	enc  *zstd.Encoder
	dec  *zstd.Decoder
	// plains holds the buffers (*[]byte) the contents are laid out in
	// before compressing: a first write allocates only its frame.
	plains sync.Pool
}

// maxPooledPlain bounds the buffers kept in plains: a rare large answer
// does not pin its buffer.
const maxPooledPlain = 64 << 10

// Options configure a Codec.
type Options struct {
	// Dictionary, when set, compresses new responses; when nil, Builtin
	// does.
	Dictionary *Dictionary
	// Previous are dictionaries kept so that the records compressed with
	// them still expand after a rotation.
	Previous []*Dictionary
	// MinSize is the smallest response compressed; 0 means DefaultMinSize.
	MinSize int
	// Off compresses nothing new; the codec still expands the records
	// compressed before (compression.mode: off).
	Off bool
}

// New returns a codec. Two dictionaries of the set with one id are a
// mistake (a frame could not say which it needs), reported as an error.
func New(o Options) (*Codec, error) {
	c := &Codec{minSize: o.MinSize, off: o.Off, dicts: map[uint32]*Dictionary{}}
	if c.minSize <= 0 {
		c.minSize = DefaultMinSize
	}
	builtin := Builtin()
	c.active = builtin
	if o.Dictionary != nil {
		c.active = o.Dictionary
	}
	for _, d := range append([]*Dictionary{builtin, o.Dictionary}, o.Previous...) {
		if d == nil {
			continue
		}
		if prev, dup := c.dicts[d.id]; dup {
			if bytes.Equal(prev.raw, d.raw) {
				continue // the same dictionary named twice
			}
			return nil, fmt.Errorf("compress: dictionaries %s and %s have the same id %d", prev.source, d.source, d.id)
		}
		c.dicts[d.id] = d
	}
	// Made once here to report a mistake now rather than at first use.
	enc, dec, err := c.build()
	if err != nil {
		return nil, err
	}
	enc.Close()
	dec.Close()
	return c, nil
}

func (c *Codec) build() (*zstd.Encoder, *zstd.Decoder, error) {
	enc, err := zstd.NewWriter(nil,
		zstd.WithEncoderLevel(zstd.SpeedFastest),
		zstd.WithEncoderCRC(false), // the seal authenticates; a plain record has no checksum either
		zstd.WithSingleSegment(true),
		zstd.WithLowerEncoderMem(true),
		c.active.encoderOption())
	if err != nil {
		return nil, nil, fmt.Errorf("compress: %w", err)
	}
	dopts := []zstd.DOption{
		zstd.WithDecoderConcurrency(0), // one per GOMAXPROCS, for DecodeAll only
		zstd.WithDecodeAllCapLimit(true),
		zstd.WithDecoderLowmem(true),
	}
	for _, d := range c.dicts {
		dopts = append(dopts, d.decoderOption())
	}
	dec, err := zstd.NewReader(nil, dopts...)
	if err != nil {
		enc.Close()
		return nil, nil, fmt.Errorf("compress: %w", err)
	}
	return enc, dec, nil
}

// coders returns the encoder and decoder, made at first use. New made
// them once already with the same settings, so they cannot fail here.
func (c *Codec) coders() (*zstd.Encoder, *zstd.Decoder) {
	c.once.Do(func() {
		c.enc, c.dec, _ = c.build()
	})
	return c.enc, c.dec
}

// ActiveDictionary is the id of the dictionary new frames use.
func (c *Codec) ActiveDictionary() uint32 { return c.active.id }

// Compress returns r with its headers and body in one compressed frame,
// or r as it is when compressing does not pay: a response below the
// minimum size, one whose frame would not be smaller, a body omitted
// (nothing but headers), or a response compressed or sealed already.
func (c *Codec) Compress(r idem.Response) idem.Response {
	if c == nil || c.off || r.Compressed || r.Sealed || r.BodyOmitted {
		return r
	}
	n := idem.ContentsSize(&r)
	if n < c.minSize {
		return r
	}
	// The contents are laid out in a pooled buffer, which goes back to the
	// pool once compressed; the frame has its own, which the record keeps.
	enc, _ := c.coders()
	bp, _ := c.plains.Get().(*[]byte)
	if bp == nil {
		bp = new([]byte)
	}
	plain := idem.AppendContents((*bp)[:0], &r)
	frame := enc.EncodeAll(plain, append(make([]byte, 0, 1+n/2), formatZstdBare))
	if cap(plain) <= maxPooledPlain {
		*bp = plain[:0]
		c.plains.Put(bp)
	}
	if len(frame) < 5 || [4]byte(frame[1:5]) != zstdMagic {
		return r // not a frame as RFC 8878 writes it: never stored
	}
	frame = append(frame[:1], frame[5:]...)
	// The plain record stores the body and, per header, its two lengths
	// and bytes: n counts the same.
	if len(frame) >= n {
		return r
	}
	return idem.Response{Status: r.Status, Body: frame, Compressed: true}
}

// Expand returns the response r compressed, with the headers and body the
// upstream sent; an uncompressed r is returned as it is. maxBody bounds
// the expanded headers and body (the policy's max_stored_body and a
// margin for headers): a frame that would expand past it is refused
// without being expanded.
func (c *Codec) Expand(r idem.Response, maxBody int) (idem.Response, error) {
	if !r.Compressed {
		return r, nil
	}
	if c == nil {
		return idem.Response{}, fmt.Errorf("%w: compression is off on this server", ErrExpand)
	}
	if r.Sealed {
		return idem.Response{}, fmt.Errorf("%w: still sealed", ErrExpand)
	}
	if len(r.Body) == 0 || (r.Body[0] != formatZstd && r.Body[0] != formatZstdBare) {
		return idem.Response{}, fmt.Errorf("%w: unknown format", ErrExpand)
	}
	frame := r.Body[1:]
	if r.Body[0] == formatZstdBare {
		// The magic number back in front, in a pooled buffer: the decoder
		// keeps nothing of its input.
		bp, _ := c.plains.Get().(*[]byte)
		if bp == nil {
			bp = new([]byte)
		}
		frame = append(append((*bp)[:0], zstdMagic[:]...), frame...)
		defer func() {
			if cap(frame) <= maxPooledPlain {
				*bp = frame[:0]
				c.plains.Put(bp)
			}
		}()
	}
	var h zstd.Header
	if err := h.Decode(frame); err != nil {
		return idem.Response{}, fmt.Errorf("%w: %w", ErrExpand, err)
	}
	if h.DictionaryID != 0 && c.dicts[h.DictionaryID] == nil {
		return idem.Response{}, fmt.Errorf("%w: it needs dictionary %d, which this server does not have "+
			"(keep a rotated dictionary in previous_dictionaries for the retention)", ErrExpand, h.DictionaryID)
	}
	if !h.HasFCS || h.FrameContentSize > uint64(maxBody) {
		return idem.Response{}, fmt.Errorf("%w: frame of %d bytes (size known: %v) exceeds the limit of %d",
			ErrExpand, h.FrameContentSize, h.HasFCS, maxBody)
	}
	_, dec := c.coders()
	plain, err := dec.DecodeAll(frame, make([]byte, 0, h.FrameContentSize))
	if err != nil {
		return idem.Response{}, fmt.Errorf("%w: %w", ErrExpand, err)
	}
	if uint64(len(plain)) != h.FrameContentSize {
		return idem.Response{}, fmt.Errorf("%w: expanded to %d bytes, frame says %d", ErrExpand, len(plain), h.FrameContentSize)
	}
	out, err := idem.ParseContents(plain)
	if err != nil {
		return idem.Response{}, fmt.Errorf("%w: %w", ErrExpand, err)
	}
	out.Status, out.BodyOmitted = r.Status, r.BodyOmitted
	return out, nil
}

// Close releases the codec's buffers. A codec may be dropped without it:
// the garbage collector takes them then.
func (c *Codec) Close() {
	if c == nil {
		return
	}
	c.once.Do(func() {}) // nothing to release if never used
	if c.enc != nil {
		c.enc.Close()
		c.dec.Close()
	}
}
