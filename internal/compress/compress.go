// Package compress makes a stored response smaller before it is sealed
// and stored, and gives back, on a replay, the bytes the upstream sent.
//
// A compressed response holds its headers and body together
// (idem.AppendContents) in one frame, and Headers is empty:
//
//	format (1 byte) | frame
//
// Format 2 is a zstd frame (RFC 8878) without its 4-byte magic number,
// which is the same in every frame and is put back to expand it; format 1
// is the whole zstd frame, still expanded, never written since format 2.
// Format 3 is an S2 block (github.com/klauspost/compress/s2, its block
// format: the expanded length as a uvarint, then the compressed data)
// made with the built-in dictionary's words as its S2 dictionary. Four
// bytes of magic are worth dropping: a record's value is rounded up to
// the allocator's next size class.
//
// Headers go into the frame with the body since an API's headers repeat
// from one answer to the next, which a dictionary compresses to almost
// nothing. The zstd frame header names the dictionary its frame needs
// (RFC 8878 §3.1.1.1.3, Dictionary_ID), so a record keeps opening for as
// long as the server knows that dictionary: the built-in one (Builtin)
// always, a policy's trained ones while they stay in its configuration.
// An S2 block's dictionary is the built-in words, fixed by its format.
//
// Which one, by measurement (docs/performance.md, "Memory per stored
// answer"; BenchmarkCompress): zstd at its fastest level makes the
// smaller frames (a 1.4 KiB payment-intent answer of package corpus to
// 0.45 of its size against S2's 0.53, a 17 KiB list to 0.22 against
// 0.30), but every zstd frame made with a dictionary pays a fixed cost
// (the encoder copies the dictionary's 256 KiB match table back before
// each frame, and builds its entropy tables), about 13 µs for the 1.4 KiB
// answer against S2's 2 µs, which on a first write is some 20 % of the
// server's CPU. So Auto, the default, makes S2 blocks below AutoZstdFrom,
// where that fixed cost is most of the work and S2's frames are a tenth
// larger, and zstd frames from there on, where zstd's frames are a third
// smaller; below AutoZstdFrom too, an answer S2 finds little to repeat in
// is made a zstd frame as well and the smaller kept (autoRetryNum). A
// trained dictionary is a zstd dictionary, and a policy that names one
// has every answer compressed with it.
package compress

import (
	"bytes"
	"errors"
	"fmt"
	"sync"

	"github.com/klauspost/compress/s2"
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
	// formatS2Builtin: an S2 block with the built-in words as its
	// dictionary.
	formatS2Builtin = 3
)

// Mode is how a codec compresses new responses.
type Mode uint8

// The modes, as compression.mode names them.
const (
	// Auto makes S2 blocks of responses below AutoZstdFrom and zstd
	// frames of the others; with a trained dictionary, zstd frames of
	// every response. An S2 block that keeps more than the share
	// autoRetry* of its response is made a zstd frame too, and the
	// smaller is kept.
	Auto Mode = iota
	// Zstd makes zstd frames of every response: the smallest records, at
	// several times S2's CPU.
	Zstd
	// S2 makes S2 blocks of every response: the least CPU, larger
	// records; it cannot use a trained dictionary.
	S2
	// Off compresses nothing new; records compressed before still expand.
	Off
)

// AutoZstdFrom is the size (idem.ContentsSize) from which Auto makes zstd
// frames rather than S2 blocks. On package corpus, S2 takes a 1.4 KiB
// object to 1.18 times zstd's frame at 0.14 of its CPU, and a 17 KiB list
// to 1.38 times at 0.42 (BenchmarkCompress): below a few KiB zstd's fixed
// cost is most of its work and its frames are barely smaller.
const AutoZstdFrom = 4 << 10

// An S2 block larger than autoRetryNum/autoRetryDen of its response's
// contents found little to repeat: what it holds is mostly literals, one
// byte each (S2 has no entropy coding), which zstd's Huffman and FSE
// stages code in fewer bits, so Auto makes the zstd frame as well and
// keeps the smaller. On package corpus no object or list block is above
// it (objects come to 0.53 of their contents, lists 0.30) and no error
// (0.59); on the orders of another API's style (corpus.Order, whose words
// the built-in dictionary was not written for) every one is, at 0.73, and
// zstd takes them to 0.58 (TestAutoRetriesWithZstd; docs/performance.md,
// "Memory per stored answer"). Only such answers pay both encoders.
const (
	autoRetryNum = 13
	autoRetryDen = 20
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
	mode    Mode
	// active is the dictionary new frames use.
	active *Dictionary
	// dicts are every dictionary the decoder knows, by id.
	dicts map[uint32]*Dictionary

	once sync.Once
	enc  *zstd.Encoder
	dec  *zstd.Decoder
	// words is the built-in dictionary as S2's: it makes and opens
	// format 3. Its tables are built at first use and shared: S2's
	// dictionary encoder keeps its own per call.
	words *s2.Dict
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
	// Mode is how new responses are compressed; the codec expands the
	// records of every mode whatever it is.
	Mode Mode
}

// New returns a codec. Two dictionaries of the set with one id are a
// mistake (a frame could not say which it needs), reported as an error.
func New(o Options) (*Codec, error) {
	c := &Codec{minSize: o.MinSize, mode: o.Mode, dicts: map[uint32]*Dictionary{}}
	if c.minSize <= 0 {
		c.minSize = DefaultMinSize
	}
	if o.Mode > Off {
		return nil, fmt.Errorf("compress: unknown mode %d", o.Mode)
	}
	builtin := Builtin()
	c.active = builtin
	if o.Dictionary != nil {
		if o.Mode == S2 {
			return nil, fmt.Errorf("compress: %s is a zstd dictionary, which S2 cannot use "+
				"(mode auto or zstd compresses with it)", o.Dictionary.source)
		}
		c.active = o.Dictionary
	}
	if c.words = s2.MakeDict([]byte(builtinVocabulary), nil); c.words == nil {
		return nil, errors.New("compress: the built-in words do not make an S2 dictionary")
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

// encoderOptions are the settings every zstd frame is made with, by d.
func encoderOptions(d *Dictionary) []zstd.EOption {
	return []zstd.EOption{
		zstd.WithEncoderLevel(zstd.SpeedFastest),
		zstd.WithEncoderCRC(false), // the seal authenticates; a plain record has no checksum either
		zstd.WithSingleSegment(true),
		zstd.WithLowerEncoderMem(true),
		d.encoderOption(),
	}
}

func (c *Codec) build() (*zstd.Encoder, *zstd.Decoder, error) {
	enc, err := zstd.NewWriter(nil, encoderOptions(c.active)...)
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
	if c == nil || c.mode == Off || r.Compressed || r.Sealed || r.BodyOmitted {
		return r
	}
	n := idem.ContentsSize(&r)
	if n < c.minSize || c.incompressible(r.Body) {
		return r
	}
	// The contents are laid out in a pooled buffer, which goes back to the
	// pool once compressed; the frame has its own, which the record keeps.
	bp := c.buffer()
	plain := idem.AppendContents((*bp)[:0], &r)
	var frame []byte
	if c.usesS2(n) {
		frame = c.s2Frame(plain)
		if c.mode == Auto && len(frame)*autoRetryDen > n*autoRetryNum {
			if z := c.zstdFrame(plain, n); z != nil && len(z) < len(frame) {
				frame = z
			}
		}
	} else {
		frame = c.zstdFrame(plain, n)
	}
	c.release(bp, plain)
	// The plain record stores the body and, per header, its two lengths
	// and bytes: n counts the same.
	if frame == nil || len(frame) >= n {
		return r
	}
	return idem.Response{Status: r.Status, Body: frame, Compressed: true}
}

// A large answer is first tried on a sample: its first sampleBytes, made
// a zstd frame. When zstd cannot take a fiftieth off them, the answer is
// taken to be incompressible (an image, an archive, a body compressed
// already) and kept as it came, without laying it out and encoding it
// whole: that work would be thrown away, and its buffers, several times
// the answer's size, are garbage the collector lets build up. zstd is
// the sample's judge in every mode because it is the stronger of the two
// encoders: what it cannot shrink, S2, with no entropy coding, cannot
// either. An answer whose start is incompressible and whose rest is not
// is kept uncompressed too: it costs its store more bytes, never a
// different replay.
const (
	sampleFrom  = 64 << 10
	sampleBytes = 16 << 10
)

// incompressible reports a body of at least sampleFrom bytes whose sample
// zstd cannot shrink by a fiftieth.
func (c *Codec) incompressible(body []byte) bool {
	if len(body) < sampleFrom {
		return false
	}
	enc, _ := c.coders()
	bp := c.buffer()
	frame := enc.EncodeAll(body[:sampleBytes], (*bp)[:0])
	c.release(bp, frame)
	return len(frame)*50 >= sampleBytes*49
}

// buffer is a buffer of plains, for the caller to give back with release.
func (c *Codec) buffer() *[]byte {
	if bp, _ := c.plains.Get().(*[]byte); bp != nil {
		return bp
	}
	return new([]byte)
}

// release gives bp back to plains holding b, its content last written,
// unless b is too large to keep.
func (c *Codec) release(bp *[]byte, b []byte) {
	if cap(b) <= maxPooledPlain {
		*bp = b[:0]
		c.plains.Put(bp)
	}
}

// usesS2 reports whether a response of n bytes of contents is made an S2
// block rather than a zstd frame.
func (c *Codec) usesS2(n int) bool {
	switch c.mode {
	case S2:
		return true
	case Auto:
		return n < AutoZstdFrom && c.active.id == BuiltinID
	}
	return false
}

// s2Frame is plain as format 3.
func (c *Codec) s2Frame(plain []byte) []byte {
	// S2 writes its block whole into a buffer of its worst case; the
	// record keeps a copy of the size it came to.
	sp := c.buffer()
	block := c.words.Encode((*sp)[:cap(*sp)], plain)
	frame := append(append(make([]byte, 0, 1+len(block)), formatS2Builtin), block...)
	c.release(sp, block)
	return frame
}

// zstdFrame is plain as format 2, or nil when the encoder did not write a
// frame as RFC 8878 does (never stored).
func (c *Codec) zstdFrame(plain []byte, n int) []byte {
	enc, _ := c.coders()
	frame := enc.EncodeAll(plain, append(make([]byte, 0, 1+n/2), formatZstdBare))
	if len(frame) < 5 || [4]byte(frame[1:5]) != zstdMagic {
		return nil
	}
	return append(frame[:1], frame[5:]...)
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
	if len(r.Body) == 0 {
		return idem.Response{}, fmt.Errorf("%w: unknown format", ErrExpand)
	}
	var plain []byte
	var err error
	switch r.Body[0] {
	case formatZstd, formatZstdBare:
		plain, err = c.expandZstd(r.Body, maxBody)
	case formatS2Builtin:
		plain, err = c.expandS2(r.Body[1:], maxBody)
	default:
		return idem.Response{}, fmt.Errorf("%w: unknown format", ErrExpand)
	}
	if err != nil {
		return idem.Response{}, err
	}
	out, err := idem.ParseContents(plain)
	if err != nil {
		return idem.Response{}, fmt.Errorf("%w: %w", ErrExpand, err)
	}
	out.Status, out.BodyOmitted = r.Status, r.BodyOmitted
	return out, nil
}

// expandS2 expands an S2 block of format 3, refusing one that says it
// expands past maxBody before expanding it: s2.Dict.Decode allocates
// whatever length the block declares (up to 4 GiB) when dst is shorter.
func (c *Codec) expandS2(block []byte, maxBody int) ([]byte, error) {
	n, err := s2.DecodedLen(block)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrExpand, err)
	}
	if n > maxBody {
		return nil, fmt.Errorf("%w: block of %d bytes exceeds the limit of %d", ErrExpand, n, maxBody)
	}
	plain, err := c.words.Decode(make([]byte, n), block)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrExpand, err)
	}
	return plain, nil
}

// expandZstd expands a zstd frame of format 1 or 2 (body, its format byte
// first), refusing one that needs a dictionary the codec does not have or
// says it expands past maxBody before expanding it.
func (c *Codec) expandZstd(body []byte, maxBody int) ([]byte, error) {
	frame := body[1:]
	if body[0] == formatZstdBare {
		// The magic number back in front, in a pooled buffer: the decoder
		// keeps nothing of its input.
		bp := c.buffer()
		frame = append(append((*bp)[:0], zstdMagic[:]...), frame...)
		defer c.release(bp, frame)
	}
	var h zstd.Header
	if err := h.Decode(frame); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrExpand, err)
	}
	if h.DictionaryID != 0 && c.dicts[h.DictionaryID] == nil {
		return nil, fmt.Errorf("%w: it needs dictionary %d, which this server does not have "+
			"(keep a rotated dictionary in previous_dictionaries for the retention)", ErrExpand, h.DictionaryID)
	}
	if !h.HasFCS || h.FrameContentSize > uint64(maxBody) {
		return nil, fmt.Errorf("%w: frame of %d bytes (size known: %v) exceeds the limit of %d",
			ErrExpand, h.FrameContentSize, h.HasFCS, maxBody)
	}
	_, dec := c.coders()
	plain, err := dec.DecodeAll(frame, make([]byte, 0, h.FrameContentSize))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrExpand, err)
	}
	if uint64(len(plain)) != h.FrameContentSize {
		return nil, fmt.Errorf("%w: expanded to %d bytes, frame says %d", ErrExpand, len(plain), h.FrameContentSize)
	}
	return plain, nil
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
